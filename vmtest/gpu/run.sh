#!/bin/sh
# vmtest/gpu/run.sh OUT [suite.py options]: the real-GPU validation suite,
# with the cudatrace built in this tree (bin/cudatrace, or $CUDATRACE) and
# the Python that has PyTorch, JAX and CuPy ($PYTHON, default python3).
# Results: OUT/results.md and OUT/results.json. See suite.py for the checks.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:?usage: vmtest/gpu/run.sh OUT [--only CHECK,...] [--steps N]}
shift
bin=${CUDATRACE:-$root/bin/cudatrace}
if [ ! -x "$bin" ]; then
	echo "run.sh: no cudatrace at $bin: run 'make build' first, or set CUDATRACE" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "run.sh: run as root: cudatrace needs CAP_BPF and CAP_PERFMON" >&2
	exit 2
fi
exec "${PYTHON:-python3}" "$here/suite.py" --cudatrace "$bin" --out "$out" "$@"
