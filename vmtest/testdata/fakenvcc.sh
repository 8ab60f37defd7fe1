#!/bin/sh
# A stand-in for NVIDIA's nvcc, installed as "nvcc" on PATH for PyCUDA's
# compiler (pycuda.compiler.compile_plain): it answers --version, and
# "compiles" kernel.cu to kernel.cubin by copying the source, which the
# stand-in driver's cuModuleLoadData accepts (it runs nothing).
# No CUDA toolkit is installed on the test machine, and none may be.
set -eu
case "${1:-}" in
--version)
	echo "nvcc: cudatrace stand-in, release 11.8"
	exit 0
	;;
--cubin | --ptx | --fatbin)
	target=${1#--}
	shift
	;;
*)
	echo "fakenvcc: unsupported command line: $*" >&2
	exit 1
	;;
esac
src=
for a in "$@"; do
	case "$a" in *.cu) src=$a ;; esac
done
[ -n "$src" ] || { echo "fakenvcc: no .cu file in: $*" >&2; exit 1; }
cp "$src" "${src%.cu}.$target"
