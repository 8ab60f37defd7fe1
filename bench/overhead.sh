#!/usr/bin/env bash
# End-to-end overhead of tracing cudaMalloc/cudaFree pairs, as ratios
# measured side by side in one run (machines here are noisy: never quote a
# lone time). bench/loop.c times its own loop (tracer start-up excluded).
# Modes, interleaved round by round:
#   untraced   the loop alone
#   floor      bpftrace with empty probes on cudaMalloc entry+return and
#              cudaFree: the cost of the uprobe traps themselves
#   cudatrace  cudatrace record (stacks, trace file, ledger), default
#              16 KiB stack window copied into each allocation record
#   ct-nowin   the same with --stack-window 0: frame-pointer stacks only
#   ct-win64k  the same with --stack-window 64KiB, the largest
#   bpftrace   bpftrace printing each event with its user stack
#   baseline   with BASELINE=/path/to/cudatrace: that build, default
#              options (a before/after comparison in the same run)
# Every round runs twice: on an otherwise idle machine, then with one core
# kept busy by another process (the realistic case: a job keeps its cores
# busy and the reader shares them).
# Needs root, gcc, bpftrace. Usage: bench/overhead.sh [PAIRS] [ROUNDS]
PAIRS=${1:-20000}
ROUNDS=${2:-5}
BUSY=
. "$(dirname "$0")/lib.sh"
on_exit '[ -z "$BUSY" ] || kill "$BUSY"'
build_loop

# bpftrace_run PROGRAM OUT: the loop under bpftrace running PROGRAM.
bpftrace_run() {
	bpftrace_start "$1"
	"$W/loop" "$PAIRS" >"$2"
	bpftrace_stop
}

BT="uprobe:$LIB:cudaMalloc { @sz[tid] = arg1; }
uretprobe:$LIB:cudaMalloc { printf(\"%d %d %d %s\n\", pid, tid, @sz[tid], ustack); delete(@sz[tid]); }
uprobe:$LIB:cudaFree { printf(\"free %d %d %p\n\", pid, tid, arg0); }"

MODES=(untraced floor ct-nowin cudatrace ct-win64k bpftrace)
[ -n "${BASELINE:-}" ] && MODES+=(baseline)

# one MODE: one run of the loop under MODE; prints its ns per pair.
one() {
	case $1 in
	untraced) "$W/loop" "$PAIRS" >"$W/o" ;;
	floor) bpftrace_run "$FLOOR" "$W/o" ;;
	bpftrace) bpftrace_run "$BT" "$W/o" ;;
	cudatrace) "$CUDATRACE" record -q --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/o" 2>"$W/err" ;;
	ct-nowin) "$CUDATRACE" record -q --stack-window 0 --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/o" 2>"$W/err" ;;
	ct-win64k) "$CUDATRACE" record -q --stack-window 64KiB --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/o" 2>"$W/err" ;;
	baseline) "$BASELINE" record -q --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" >"$W/o" 2>"$W/err" ;;
	esac
	case $1 in ct-* | cudatrace | baseline) grep -E 'lost' "$W/err" | sed "s/^/$1: /" >&2 || true ;; esac
	ns_per_pair "$W/o"
}

declare -A all
for load in idle busy; do
	[ $load = busy ] && busy_core
	for r in $(seq "$ROUNDS"); do
		line="$load round $r:"
		for m in "${MODES[@]}"; do
			v=$(one "$m"); all[$load/$m]+="$v "; line+=" $m $v"
		done
		echo "$line ns/pair" >&2
	done
	[ $load = busy ] && { kill "$BUSY"; wait "$BUSY" 2>/dev/null || true; BUSY=; }
done

printf '%-10s %12s %9s %12s %9s\n' mode "idle ns" "x floor" "busy ns" "x floor"
fi=$(echo "${all[idle/floor]}" | median)
fb=$(echo "${all[busy/floor]}" | median)
for m in "${MODES[@]}"; do
	vi=$(echo "${all[idle/$m]}" | median)
	vb=$(echo "${all[busy/$m]}" | median)
	printf '%-10s %12s %9s %12s %9s\n' "$m" "$vi" "$(ratio "$vi" "$fi")" "$vb" "$(ratio "$vb" "$fb")"
done
echo "(CUDATRACE=$CUDATRACE${BASELINE:+ BASELINE=$BASELINE} bench/overhead.sh $PAIRS $ROUNDS: ns per cudaMalloc+cudaFree pair timed inside the loop, median of $ROUNDS interleaved rounds; busy: one core kept busy by another process; $(nproc) CPUs, $(uname -r))"
