#!/usr/bin/env bash
# End-to-end overhead of tracing cudaMalloc/cudaFree pairs, as ratios
# measured side by side in one run (machines here are noisy: never quote a
# lone time). Modes, interleaved round by round:
#   untraced   the loop alone
#   floor      bpftrace with empty probes on cudaMalloc entry+return and
#              cudaFree: the cost of the uprobe traps themselves
#   cudatrace  cudatrace record (stacks, trace file, ledger), default
#              16 KiB stack window copied into each allocation record
#   ct-nowin   the same with --stack-window 0: frame-pointer stacks only
#   ct-win64k  the same with --stack-window 64KiB, the largest
#   bpftrace   bpftrace printing each event with its user stack
# Needs root, gcc, bpftrace. Usage: bench/overhead.sh [PAIRS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-20000}
ROUNDS=${2:-5}
CUDATRACE=${CUDATRACE:-bin/cudatrace}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

. bench/loop.sh

ns() { sed -n 's/.*ns_per_pair=\([0-9]*\).*/\1/p' "$1"; }

# bpftrace_run PROGRAM OUT: start bpftrace, wait until it has attached, run the loop.
bpftrace_run() {
	bpftrace -e "$1" >"$W/bt.out" 2>&1 &
	local bt=$!
	for _ in $(seq 200); do grep -q Attaching "$W/bt.out" && break; sleep 0.05; done
	sleep 1 # "Attaching" comes before the probes are in; under load 0.2 s was once too short
	"$W/loop" "$PAIRS" >"$2"
	kill -INT $bt; wait $bt || true
}

FLOOR="uprobe:$LIB:cudaMalloc {} uretprobe:$LIB:cudaMalloc {} uprobe:$LIB:cudaFree {}"
BT="uprobe:$LIB:cudaMalloc { @sz[tid] = arg1; }
uretprobe:$LIB:cudaMalloc { printf(\"%d %d %d %s\n\", pid, tid, @sz[tid], ustack); delete(@sz[tid]); }
uprobe:$LIB:cudaFree { printf(\"free %d %d %p\n\", pid, tid, arg0); }"

declare -A all
for r in $(seq "$ROUNDS"); do
	"$W/loop" "$PAIRS" >"$W/u"; all[untraced]+="$(ns "$W/u") "
	bpftrace_run "$FLOOR" "$W/f"; all[floor]+="$(ns "$W/f") "
	"$CUDATRACE" record -q --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/c" 2>"$W/c.err"
	all[cudatrace]+="$(ns "$W/c") "
	"$CUDATRACE" record -q --stack-window 0 --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/n" 2>"$W/n.err"
	all[ct-nowin]+="$(ns "$W/n") "
	"$CUDATRACE" record -q --stack-window 64KiB --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/x" 2>"$W/x.err"
	all[ct-win64k]+="$(ns "$W/x") "
	bpftrace_run "$BT" "$W/b"; all[bpftrace]+="$(ns "$W/b") "
	echo "round $r: untraced $(ns "$W/u") floor $(ns "$W/f") cudatrace $(ns "$W/c") ct-nowin $(ns "$W/n") ct-win64k $(ns "$W/x") bpftrace $(ns "$W/b") ns/pair" >&2
done
grep -E 'lost|warning' "$W/c.err" "$W/n.err" "$W/x.err" >&2 || true

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
f=$(echo "${all[floor]}" | median)
printf '%-10s %12s %14s\n' mode "ns/pair" "x floor"
for m in untraced floor ct-nowin cudatrace ct-win64k bpftrace; do
	v=$(echo "${all[$m]}" | median)
	printf '%-10s %12s %14s\n' "$m" "$v" "$(awk -v v="$v" -v f="$f" 'BEGIN {printf "%.2f", v/f}')"
done
echo "($PAIRS cudaMalloc+cudaFree pairs per run, median of $ROUNDS interleaved rounds, $(nproc) CPUs, $(uname -r))"
