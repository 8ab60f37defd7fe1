#!/usr/bin/env bash
# The reader's CPU per event: cudatrace's own CPU time (user + system, from
# /usr/bin/time; the traced program's is not in it: it is attached with
# --pid) over a run of PAIRS cudaMalloc+cudaFree pairs (2 events each),
# less that of a run of none (start-up and shut-down), per event. Default
# recording (stacks unwound in BPF, or from a 16 KiB window with
# CUDATRACE_UNWIND=window or an older build; trace file written).
# Then the same run with `record -v`: the process's CPU per event from its
# first event to its last, and the time per stage on the reader's goroutine.
# With BASELINE=/path/to/cudatrace, that build too, interleaved (it may
# lack -v). With PYTHON=/path/to/python3.X (CPython 3.10-3.13), the loop
# is bench/pyloop.py's instead, eight Python frames deep through ctypes:
# each allocation's Python frames read and merged, and its 40-odd native
# frames unwound through the interpreter. Needs root and gcc. Usage:
# bench/readercpu.sh [PAIRS] [ROUNDS]
PAIRS=${1:-500000}
ROUNDS=${2:-3}
. "$(dirname "$0")/lib.sh"
build_loop

# run BINARY N [ARGS]: cudatrace's CPU seconds tracing a loop of N pairs;
# its stderr is left in $W/err.
run() {
	local bin=$1 n=$2
	shift 2
	rm -f "$W/go"
	if [ -n "${PYTHON:-}" ]; then
		"$PYTHON" bench/pyloop.py "$LIB" "$n" "$W/go" >"$W/loop.out" &
	else
		"$W/loop" "$n" "$W/go" >"$W/loop.out" &
	fi
	local lp=$!
	/usr/bin/time -f '%U %S' -o "$W/time" "$bin" record "$@" --pid $lp --lib "$LIB" -o "$W/t.trace" >/dev/null 2>"$W/err" &
	local ct=$!
	for _ in $(seq 600); do grep -q 'cudatrace: attached' "$W/err" && break; sleep 0.05; done
	touch "$W/go"
	wait $lp
	wait $ct || true
	grep -E 'lost' "$W/err" >&2 || true
	# the last line: /usr/bin/time puts "Command exited with non-zero
	# status" before it when cudatrace exits so
	tail -n 1 "$W/time" | awk '{printf "%.3f", $1 + $2}'
}

events() { sed -n 's/.* \([0-9]*\) events written.*/\1/p' "$W/err"; }

BUILDS=(cudatrace)
[ -n "${BASELINE:-}" ] && BUILDS+=(baseline)
bin() { if [ "$1" = baseline ]; then echo "$BASELINE"; else echo "$CUDATRACE"; fi; }
declare -A all
for r in $(seq "$ROUNDS"); do
	line="round $r:"
	for b in "${BUILDS[@]}"; do
		c0=$(run "$(bin "$b")" 0)
		c=$(run "$(bin "$b")" "$PAIRS")
		ev=$(events)
		v=$(awk -v c="$c" -v z="$c0" -v e="$ev" 'BEGIN {printf "%.0f", (c - z) * 1e9 / e}')
		all[$b]+="$v "
		line+=" $b ${v}ns/event ($c s - $c0 s over $ev events)"
	done
	run "$CUDATRACE" "$PAIRS" -v >/dev/null
	grep 'reader:' "$W/err" | sed 's/^cudatrace: //' >>"$W/stages"
	echo "$line" >&2
done
printf '%-10s %22s\n' build "CPU ns per event"
for b in "${BUILDS[@]}"; do printf '%-10s %22s\n' "$b" "$(echo "${all[$b]}" | median)"; done
[ -n "${BASELINE:-}" ] && echo "cudatrace/baseline: $(ratio "$(echo "${all[cudatrace]}" | median)" "$(echo "${all[baseline]}" | median)")"
echo "record -v, per round:"
cat "$W/stages"
echo "(CUDATRACE=$CUDATRACE${BASELINE:+ BASELINE=$BASELINE}${PYTHON:+ PYTHON=$PYTHON} bench/readercpu.sh $PAIRS $ROUNDS: median of $ROUNDS interleaved rounds, ${PYTHON:+$("$PYTHON" -V), }$(nproc) CPUs, $(uname -r))"
