#!/usr/bin/env bash
# Shut-down: milliseconds from SIGINT to the exit of `cudatrace agent` and
# of `cudatrace record --pid`, each attached to the stand-in libcudart (60
# probes), idle and while bench/loop allocates and frees as fast as it can.
# BASELINE=path/to/other/cudatrace adds its runs to the same rounds
# (before/after), interleaved. Needs root and gcc.
# Usage: bench/stop.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
CUDATRACE=${CUDATRACE:-bin/cudatrace}
BASELINE=${BASELINE:-}
W=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"' EXIT
. bench/loop.sh

now() { date +%s%N; }

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

declare -A all
bins="cudatrace"
[ -n "$BASELINE" ] && bins="baseline cudatrace"
for r in $(seq "$ROUNDS"); do
	line="round $r:"
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
			all[$b-agent-$load]+="$ag "
			all[$b-record-$load]+="$rp "
			line+=" $b agent/$load $ag record/$load $rp"
		done
		kill -CONT $target 2>/dev/null || true
		kill $target
		wait $target 2>/dev/null || true
	done
	echo "$line ms" >&2
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-10s %-7s %10s %10s\n' binary load "agent ms" "record ms"
for b in $bins; do
	for load in idle load; do
		printf '%-10s %-7s %10s %10s\n' "$b" $load "$(echo "${all[$b-agent-$load]}" | median)" "$(echo "${all[$b-record-$load]}" | median)"
	done
done
echo "(ms from SIGINT to exit: agent --lib LIB, record --lib LIB --pid P; idle: P stopped, load: P allocating; median of $ROUNDS interleaved rounds, $(nproc) CPUs, $(uname -r))"
