#!/usr/bin/env bash
# Installs what `make test` needs on Debian 12 and fetches the kernels the
# vmtest kernel matrix boots under QEMU. Shared by `make test` (the
# README's test command) and .ci/run. Idempotent, and silent when
# everything is already there.
#
# Kernels go to $CUDATRACE_KERNEL_CACHE (default /var/cache/cudatrace-vmtest),
# outside the checkout so that they survive between runs: kernels/<series>/vmlinuz
# and kernels/<series>/release. They come from Debian through a private apt
# state under that directory (its own sources list and package lists), so
# the host's apt sources and lists are untouched: 6.1 from bookworm, 6.12
# from bookworm-security (Debian 12's 6.12 LTS kernel), 5.10 from bullseye.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
cache=${CUDATRACE_KERNEL_CACHE:-/var/cache/cudatrace-vmtest}

if [ "$(id -u)" != 0 ]; then
	echo "scripts/deps.sh: not root: installing nothing (the end-to-end tests need root anyway)" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null; then
	echo "scripts/deps.sh: no apt-get: install the packages README.md lists by hand" >&2
	exit 0
fi

# Waits for another apt (another checkout's tests) instead of failing.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

sources=/etc/apt/sources.list.d/debian.sources
# NVIDIA's real libcudart/libcuda/libnvidia-ml live in Debian's non-free component.
if [ -f "$sources" ] && grep -q '^Components: main$' "$sources"; then
	sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$sources"
	apt_get update -qq
fi
# python3.11: Debian 12's own interpreter, built without DWARF (pystack's offset tables are tested on it).
# qemu-system-x86, busybox-static: the kernel matrix (vmtest/kernels_test.go).
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross: the arm64 build (make release, make generate's
# arm64 object: linux-libc-dev-arm64-cross's <asm/ptrace.h>) and the arm64 stand-ins; qemu-system-arm:
# the arm64 kernels of the matrix.
# python3-numba: a real CUDA client (ctypes over libcuda.so.1) run on the stand-in driver (vmtest/numba_test.go).
# debootstrap: the sid root below.
# openmpi-bin: a real mpirun launching a job's ranks (vmtest/jobs_test.go).
# python3-setproctitle: a worker that renames itself as Ray's do, on Debian's python3.11 (proc/libcenv_test.go, vmtest/title_test.go).
# python3-appdirs ... libboost-thread1.74.0: what python3-pycuda needs besides the CUDA toolkit (below).
# chromium, fonts-dejavu-core: the HTML page's tests run it headless (internal/browsertest), with a font to draw text.
need=()
for p in clang llvm gcc make binutils xz-utils bpftool bpftrace libbpf-dev systemtap-sdt-dev \
	libcudart11.0 libcuda1 libnvidia-ml1 tmux util-linux prometheus python3.11 \
	qemu-system-x86 busybox-static cpio python3-numba python3-setproctitle debootstrap openmpi-bin \
	gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-system-arm \
	python3-appdirs python3-decorator python3-numpy python3-pytools python3-mako \
	libboost-python1.74.0 libboost-thread1.74.0 chromium fonts-dejavu-core debuginfod; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	echo "scripts/deps.sh: installing ${need[*]}" >&2
	apt_get update -qq
	apt_get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# The sid root: Debian sid's CPython 3.15, 3.14 and its newest 3.13, whose
# libc is newer than Debian 12's, so the Python tests run them in a
# container of their own with this as its root (internal/testenv
# SidPython). Made once, outside the checkout, from the mirror apt already
# uses; a root made before lacks a version added since, which apt in the
# root installs (its lists refreshed first: they are older than the
# version, and sid's Release files may be past their Valid-Until).
sid=${CUDATRACE_SID_ROOT:-/var/cache/cudatrace-sid/root}
sidpy=(python3.15 python3.14 python3.13)
sidneed=()
for p in "${sidpy[@]}"; do
	[ -x "$sid/usr/bin/$p" ] || sidneed+=("$p")
done
if [ ${#sidneed[@]} -gt 0 ]; then
	mirror=$(awk '$1 == "URIs:" { print $2; exit }' "$sources" 2>/dev/null || true)
	mirror=${mirror:-http://deb.debian.org/debian}
	if [ -x "$sid/usr/bin/apt-get" ]; then
		echo "scripts/deps.sh: installing ${sidneed[*]} in the Debian sid root $sid" >&2
		chroot "$sid" apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Check-Valid-Until=false update -qq >/dev/null
		chroot "$sid" apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${sidneed[@]}" >/dev/null
	else
		echo "scripts/deps.sh: making a Debian sid root with ${sidpy[*]} in $sid (from $mirror)" >&2
		rm -rf "$sid.new"
		mkdir -p "$(dirname "$sid")"
		debootstrap --variant=minbase --include="$(IFS=,; echo "${sidpy[*]}")" sid "$sid.new" "$mirror" >/dev/null
		rm -rf "$sid"
		mv "$sid.new" "$sid"
	fi
fi

# PyCUDA, a real CUDA client (a C++ extension linked against libcuda.so.1)
# run on the stand-in driver (vmtest/pycuda_test.go): Debian's
# python3-pycuda depends on nvidia-cuda-toolkit (gigabytes, and no CUDA
# toolkit may be installed here), so only its own files are unpacked, into
# $cache/pycuda/root; its light dependencies are installed above, and the
# tests build stand-ins for libcurand.so.10 and nvcc.
pycuda=$cache/pycuda
if [ ! -s "$pycuda/root/usr/lib/python3/dist-packages/pycuda/driver.py" ]; then
	echo "scripts/deps.sh: unpacking Debian's python3-pycuda (without the CUDA toolkit) into $pycuda" >&2
	rm -rf "$pycuda.new"
	mkdir -p "$pycuda.new"
	chmod 755 "$pycuda.new" # apt downloads as _apt
	# The package lists may be gone (a cleaned image) when nothing above needed an update.
	download() { (cd "$pycuda.new" && apt_get -o APT::Sandbox::User=root download -qq python3-pycuda >/dev/null); }
	download || { apt_get update -qq && download; }
	dpkg -x "$pycuda.new"/python3-pycuda_*.deb "$pycuda.new/root"
	rm -f "$pycuda.new"/python3-pycuda_*.deb
	rm -rf "$pycuda"
	mv "$pycuda.new" "$pycuda"
fi

# A stripped interpreter and its debug files, for naming frames through a
# real debuginfod server (elfutils', installed above; vmtest/debuginfod_test.go):
# Debian's python3.11 with the extension modules of libpython3.11-stdlib,
# and python3.11-dbg, whose debug files carry the build IDs of the same
# version's files, all at python3.11-dbg's version and unpacked into
# $cache/debuginfod/root, away from /usr/lib/debug (where the symbolizer
# would find them without a server) and from the host's own python3.11.
dbgpy=$cache/debuginfod
if [ ! -s "$dbgpy/root/usr/bin/python3.11" ] || [ ! -d "$dbgpy/root/usr/lib/debug/.build-id" ]; then
	echo "scripts/deps.sh: unpacking Debian's python3.11 and python3.11-dbg into $dbgpy" >&2
	rm -rf "$dbgpy.new"
	mkdir -p "$dbgpy.new"
	chmod 755 "$dbgpy.new" # apt downloads as _apt
	dbgv() { apt-cache show python3.11-dbg 2>/dev/null | awk '/^Version:/ { print $2; exit }'; }
	v=$(dbgv)
	[ -n "$v" ] || { apt_get update -qq; v=$(dbgv); }
	(cd "$dbgpy.new" && apt_get -o APT::Sandbox::User=root download -qq "python3.11-dbg=$v" "python3.11-minimal=$v" \
		"libpython3.11-minimal=$v" "libpython3.11-stdlib=$v" >/dev/null)
	for d in "$dbgpy.new"/*.deb; do dpkg -x "$d" "$dbgpy.new/root"; done
	rm -f "$dbgpy.new"/*.deb
	rm -rf "$dbgpy"
	mv "$dbgpy.new" "$dbgpy"
fi

# fetch_kernel APT SERIES PATTERN DIR: of the packages APT (a command
# prefix that runs apt-get and apt-cache in a private apt state) knows,
# the newest whose name matches PATTERN, its image unpacked to DIR/vmlinuz
# and its release to DIR/release.
fetch_kernel() {
	local apt=$1 series=$2 pattern=$3 dir=$4 pkg tmp img
	pkg=$($apt apt-cache pkgnames linux-image- | { grep -E "$pattern" || true; } | sort -V | tail -1)
	if [ -z "$pkg" ]; then
		echo "scripts/deps.sh: no Debian package for Linux $series ($pattern)" >&2
		exit 1
	fi
	tmp=$(mktemp -d)
	chmod 755 "$tmp" # apt downloads as _apt
	(cd "$tmp" && $apt apt-get -o APT::Sandbox::User=root download -qq "$pkg" >/dev/null)
	dpkg -x "$tmp"/*.deb "$tmp/root"
	mkdir -p "$dir"
	img=$(ls "$tmp"/root/boot/vmlinuz-*)
	basename "$img" | sed 's/^vmlinuz-//' >"$dir/release"
	cp "$img" "$dir/vmlinuz.tmp"
	mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
	rm -rf "$tmp"
}

# The kernels: series -> the package name's pattern. The generic amd64
# flavour has BPF, BTF, uprobes, the 8250 console, devtmpfs and initramfs
# support built in, so the image alone boots (no modules).
declare -A kernels=(
	[5.10]='^linux-image-5\.10\.0-[0-9]+-amd64-unsigned$'
	[6.1]='^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$'
	[6.12]='^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$'
)
missing=()
for s in "${!kernels[@]}"; do
	[ -s "$cache/kernels/$s/vmlinuz" ] || missing+=("$s")
done
if [ ${#missing[@]} -gt 0 ]; then
echo "scripts/deps.sh: fetching Debian kernels ${missing[*]} into $cache" >&2
apt_dir=$cache/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$cache/kernels"
cat >"$apt_dir/sources.list" <<SRC
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main
SRC
private=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/nonexistent
	-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
x86_apt() {
	local cmd=$1
	shift
	"$cmd" "${private[@]}" "$@"
}
x86_apt apt-get update -qq
for s in "${missing[@]}"; do
	fetch_kernel x86_apt "$s" "${kernels[$s]}" "$cache/kernels/$s"
done
fi

# The arm64 half of the matrix: Debian's arm64 kernels (arm64/kernels/<series>/,
# as above), and the arm64 userland its guests run, unpacked into
# arm64/root: busybox, glibc, Debian's CPython 3.11 (without DWARF, as
# distributions ship it) with the part of its standard library ctypes
# needs, bpftool. They come from a private apt state for the arm64
# architecture with its own APT_CONFIG: with -o options alone apt still
# reads the host's apt.conf.d and runs its hooks. arm64/root/.packages
# lists what was unpacked; another list here unpacks again.
arm=$cache/arm64
declare -A arm_kernels=(
	[6.1]='^linux-image-6\.1\.0-[0-9]+-arm64-unsigned$'
	[6.12]='^linux-image-6\.12\.[0-9]+\+deb12-arm64-unsigned$'
)
arm_pkgs="busybox-static libc6 libgcc-s1 python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libexpat1 zlib1g libffi8 bpftool libcap2 libelf1"
arm_missing=()
for s in "${!arm_kernels[@]}"; do
	[ -s "$arm/kernels/$s/vmlinuz" ] || arm_missing+=("$s")
done
if [ ${#arm_missing[@]} -eq 0 ] && [ "$(cat "$arm/root/.packages" 2>/dev/null)" = "$arm_pkgs" ]; then
	exit 0
fi
echo "scripts/deps.sh: fetching Debian's arm64 userland${arm_missing[*]:+ and kernels ${arm_missing[*]}} into $arm" >&2
apt_arm=$cache/apt-arm64
mkdir -p "$apt_arm/lists/partial" "$apt_arm/cache/archives/partial" "$apt_arm/none" "$arm/kernels"
: >"$apt_arm/status"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$apt_arm/sources.list" <<SRC
deb [signed-by=$keyring] http://deb.debian.org/debian bookworm main
deb [signed-by=$keyring] http://deb.debian.org/debian-security bookworm-security main
SRC
cat >"$apt_arm/apt.conf" <<CONF
Dir::Etc::sourcelist "$apt_arm/sources.list";
Dir::Etc::sourceparts "$apt_arm/none";
Dir::Etc::parts "$apt_arm/none";
Dir::Etc::preferencesparts "$apt_arm/none";
Dir::State::lists "$apt_arm/lists";
Dir::State::status "$apt_arm/status";
Dir::Cache "$apt_arm/cache";
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Sandbox::User "root";
CONF
arm_apt() { APT_CONFIG=$apt_arm/apt.conf "$@"; }
arm_apt apt-get update -qq
for s in "${arm_missing[@]}"; do
	fetch_kernel arm_apt "$s" "${arm_kernels[$s]}" "$arm/kernels/$s"
done
tmp=$(mktemp -d)
rm -rf "$arm/root.new"
# shellcheck disable=SC2086 # a list of package names
(cd "$tmp" && arm_apt apt-get download -qq $arm_pkgs >/dev/null)
for deb in "$tmp"/*.deb; do
	dpkg -x "$deb" "$arm/root.new"
done
echo "$arm_pkgs" >"$arm/root.new/.packages"
rm -rf "$tmp" "$arm/root"
mv "$arm/root.new" "$arm/root"
