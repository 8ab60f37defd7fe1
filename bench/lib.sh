# Sourced by the bench scripts (bench/*.sh): the repository root as the
# working directory, $CUDATRACE (bin/cudatrace unless set), a scratch
# directory $W removed on exit (after the script's own cleanup, set with
# on_exit), and the stand-in libcudart built there as $LIB.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDATRACE=${CUDATRACE:-bin/cudatrace}
W=$(mktemp -d)
EXIT_HOOK=:
on_exit() { EXIT_HOOK=$1; }
trap 'eval "$EXIT_HOOK"; rm -rf "$W"' EXIT
gcc -shared -fPIC -O2 -fomit-frame-pointer -pthread -Wl,-soname,libcudart.so.12 \
	-Wl,--version-script=vmtest/testdata/fakecudart.map -o "$W/libcudart.so.12" vmtest/testdata/fakecudart.c
ln -s libcudart.so.12 "$W/libcudart.so"
LIB=$W/libcudart.so.12

# FLOOR: empty probes on what bench/loop.c calls (cudaMalloc's entry and
# return, cudaFree's entry), for bpftrace: the uprobe traps alone, the
# floor every tracer's cost is measured against.
FLOOR="uprobe:$LIB:cudaMalloc {} uretprobe:$LIB:cudaMalloc {} uprobe:$LIB:cudaFree {}"

# bpftrace_start PROGRAM: runs bpftrace on PROGRAM in the background
# ($BT_PID) and returns once its probes are in; bpftrace_stop ends it.
bpftrace_start() {
	bpftrace -e "$1" >"$W/bt.out" 2>&1 &
	BT_PID=$!
	for _ in $(seq 200); do grep -q Attaching "$W/bt.out" && break; sleep 0.05; done
	sleep 1 # "Attaching" comes before the probes are in; under load 0.2 s was once too short
}

bpftrace_stop() {
	kill -INT "$BT_PID"
	# on a loaded machine bpftrace has hung in its exit for minutes
	for _ in $(seq 100); do kill -0 "$BT_PID" 2>/dev/null || break; sleep 0.1; done
	kill -KILL "$BT_PID" 2>/dev/null || true
	wait "$BT_PID" || true
}

# ns_per_pair FILE: the ns per pair bench/loop.c printed into FILE.
ns_per_pair() { sed -n 's/.*ns_per_pair=\([0-9]*\).*/\1/p' "$1"; }

# build_loop: bench/loop.c against $LIB, as $W/loop (64 KiB of stack above
# the loop) and $W/loop-shallow (none).
build_loop() {
	if [ -n "${DEPTH:-}" ]; then
		# DEPTH frames more, without frame pointers (the common case:
		# distributions build -O2 without them)
		gcc -O2 -fomit-frame-pointer -DDEPTH="$DEPTH" -I vmtest/testdata -o "$W/loop" bench/loop.c -L"$W" -lcudart -Wl,-rpath,"$W"
	else
		gcc -O2 -fno-omit-frame-pointer -I vmtest/testdata -o "$W/loop" bench/loop.c -L"$W" -lcudart -Wl,-rpath,"$W"
	fi
	gcc -O2 -fno-omit-frame-pointer -DPAD_KIB=0 -I vmtest/testdata -o "$W/loop-shallow" bench/loop.c -L"$W" -lcudart -Wl,-rpath,"$W"
}

# bpf_stats_on: the kernel's BPF run-time statistics on (each program's
# run_time_ns and run_cnt, as bpftool shows them) until the script exits,
# then as they were. It takes the script's on_exit hook.
bpf_stats_on() {
	BPF_STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
	on_exit 'sysctl -q -w kernel.bpf_stats_enabled="$BPF_STATS_WAS"'
	sysctl -q -w kernel.bpf_stats_enabled=1
}

# median: the median of the numbers on stdin, one a line or space-separated.
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# ratio A B: A/B to two places.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a/b; else print "?"}'; }

# busy_core: keeps one core busy with another process until the script
# exits (the realistic case: the traced job keeps its cores busy, and the
# reader shares them).
busy_core() {
	sh -c 'while :; do :; done' &
	BUSY=$!
}
