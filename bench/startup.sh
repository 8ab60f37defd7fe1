#!/usr/bin/env bash
# Start-up and shut-down: the wall time of `cudatrace record -- CMD` on a
# program that makes one cudaMalloc/cudaFree pair, against bpftrace running
# the same command (-c) with a stack-collecting script on the same probes
# (every entry point cudatrace attaches in the library: an entry probe on
# each, a return probe where cudatrace has one). Ratios measured side by
# side, rounds interleaved (machines here are noisy: never quote a lone
# time). BASELINE=path/to/other/cudatrace adds its runs to the same rounds
# (before/after). Then shut-down: milliseconds from SIGINT to the exit of
# `cudatrace agent` and of `cudatrace record --pid`, each attached to the
# same library, idle and while bench/loop allocates and frees as fast as
# it can, interleaved the same way. Needs root, gcc, bpftrace.
# Usage: bench/startup.sh [ROUNDS] [STOP_ROUNDS]
ROUNDS=${1:-7}
STOP_ROUNDS=${2:-3}
BASELINE=${BASELINE:-}
pids=()
. "$(dirname "$0")/lib.sh"
on_exit 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done'
build_loop

# The same probes as cudatrace: bench/btprobes prints them from loader's
# tables. bt-min: bpftrace with only cudaMalloc's entry and return and
# cudaFree's entry, the stricter reference (bpftrace's cost grows with its
# probes: each detach waits on the kernel in turn).
go run ./bench/btprobes "$LIB" >"$W/same.bt" 2>"$W/btprobes.err"
n=$(grep -c probe "$W/same.bt")
grep -E ":(cudaMalloc|cudaFree) " "$W/same.bt" >"$W/min.bt"

ms() { echo $(( ($2 - $1) / 1000000 )); }
now() { date +%s%N; }

declare -A all
aborted=0
modes="bpftrace bt-min cudatrace"
[ -n "$BASELINE" ] && modes="bpftrace bt-min baseline cudatrace"
for r in $(seq "$ROUNDS"); do
	line="round $r:"
	for m in $modes; do
		case $m in
		bpftrace|bt-min)
			script=$W/same.bt; [ "$m" = bt-min ] && script=$W/min.bt
			# bpftrace 0.17 now and then aborts (SIGABRT) on a loaded
			# machine: such a run is counted and taken again.
			for try in 1 2 3; do
				a=$(now); rc=0; bpftrace "$script" -c "$W/loop 1" >"$W/bt.out" 2>&1 || rc=$?; b=$(now)
				[ $rc = 0 ] && break
				aborted=$((aborted + 1))
			done
			grep -q "uretprobe:.*:cudaMalloc " "$W/bt.out" || { echo "$m saw no cudaMalloc (exit $rc):" >&2; cat "$W/bt.out" >&2; exit 1; } ;;
		cudatrace|baseline)
			bin=$CUDATRACE; [ "$m" = baseline ] && bin=$BASELINE
			a=$(now); "$bin" record -q --lib "$LIB" -o "$W/t.trace" -- "$W/loop" 1 >"$W/c.out" 2>"$W/c.err"; b=$(now)
			"$bin" report "$W/t.trace" >"$W/report.txt" 2>&1 || true
			grep -Eq " loop +1 +1 +0 +1.0 MiB" "$W/report.txt" || {
				echo "$m: the report lacks the allocation and its free:" >&2; cat "$W/c.err" "$W/report.txt" >&2; exit 1; } ;;
		esac
		all[$m]+="$(ms "$a" "$b") "
		line+=" $m $(ms "$a" "$b")"
	done
	echo "$line ms" >&2
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
f=$(echo "${all[bpftrace]}" | median)
printf '%-10s %10s %12s\n' mode "ms/run" "x bpftrace"
for m in $modes; do
	v=$(echo "${all[$m]}" | median)
	printf '%-10s %10s %12s\n' "$m" "$v" "$(awk -v v="$v" -v f="$f" 'BEGIN {printf "%.2f", v/f}')"
done
[ $aborted = 0 ] || echo "($aborted bpftrace runs aborted and were taken again)"
echo "(record -q --lib LIB -o T -- loop 1 against bpftrace -c 'loop 1' printing ustack: bpftrace on the same $n probes, bt-min on 3; median of $ROUNDS interleaved rounds, $(nproc) CPUs, $(uname -r))"

# stop_ms BIN VERB...: start the tracer, let it read for a second after it
# attached, SIGINT it, print the milliseconds until it exited.
stop_ms() {
	local bin=$1
	shift
	"$bin" "$@" >"$W/tracer.err" 2>&1 &
	local tr=$!
	for _ in $(seq 2400); do grep -q "cudatrace: attached" "$W/tracer.err" && break; sleep 0.05; done
	grep -q "cudatrace: attached" "$W/tracer.err" || { echo "$bin $*: did not attach:" >&2; cat "$W/tracer.err" >&2; exit 1; }
	sleep 1
	local a b
	a=$(now)
	kill -INT $tr
	wait $tr || { echo "$bin $*: exit $?:" >&2; cat "$W/tracer.err" >&2; exit 1; }
	b=$(now)
	echo $(((b - a) / 1000000))
}

declare -A stops
bins="cudatrace"
[ -n "$BASELINE" ] && bins="baseline cudatrace"
for r in $(seq "$STOP_ROUNDS"); do
	line="stop round $r:"
	for load in idle load; do
		"$W/loop" 1000000000 >/dev/null &
		target=$!
		pids+=("$target")
		# idle: the loop there, the library mapped, stopped.
		until [ "$(readlink /proc/$target/exe)" = "$W/loop" ]; do sleep 0.01; done
		[ $load = idle ] && kill -STOP $target
		for b in $bins; do
			bin=$CUDATRACE
			[ "$b" = baseline ] && bin=$BASELINE
			ag=$(stop_ms "$bin" agent --lib "$LIB" --listen 127.0.0.1:0 --dump-dir "")
			rp=$(stop_ms "$bin" record -q --lib "$LIB" --pid $target -o "$W/t.trace")
			stops[$b-agent-$load]+="$ag "
			stops[$b-record-$load]+="$rp "
			line+=" $b agent/$load $ag record/$load $rp"
		done
		kill -CONT $target 2>/dev/null || true
		kill $target
		wait $target 2>/dev/null || true
	done
	echo "$line ms" >&2
done

printf '%-10s %-7s %10s %10s\n' binary load "agent ms" "record ms"
for b in $bins; do
	for load in idle load; do
		printf '%-10s %-7s %10s %10s\n' "$b" $load "$(echo "${stops[$b-agent-$load]}" | median)" "$(echo "${stops[$b-record-$load]}" | median)"
	done
done
echo "(ms from SIGINT to exit: agent --lib LIB, record --lib LIB --pid P; idle: P stopped, load: P allocating; median of $STOP_ROUNDS interleaved rounds, $(nproc) CPUs, $(uname -r))"
