#!/usr/bin/env bash
# Events lost in a long multi-threaded run on a loaded machine: `record`
# of vmtest/testdata/mix.c (THREADS threads, each a mix of every allocation
# API, frees and failing calls, built with frame pointers) against the
# stand-in libcudart, while LOAD busy loops keep the CPUs as a busy
# training node's are (the reader then falls behind in bursts). Prints,
# per build and round: the events the trace holds, those lost (record's
# lost_events) and the allocation records kept without their stack windows
# (ringbuf_no_window), with the load average. With BASELINE=/path/to/cudatrace,
# that build too, rounds interleaved. Needs root and gcc. Usage:
# bench/burst.sh [EVENTS] [ROUNDS]   (EVENTS: about how many; 2000000 default)
EVENTS=${1:-2000000}
ROUNDS=${2:-1}
THREADS=${THREADS:-8}
LOAD=${LOAD:-6}
. "$(dirname "$0")/lib.sh"
gcc -O2 -g -fno-omit-frame-pointer -pthread -Ivmtest/testdata -o "$W/mix" vmtest/testdata/mix.c \
	-L"$W" -l:libcudart.so.12 -Wl,-rpath,"$W"
export FAKECUDA_DEVICES=2 FAKECUDA_MEM_LIMIT=$((1 << 30))
# mix makes about 0.94 events an iteration with these settings (its own
# tally: allocations, frees and failed calls)
ITERS=$((EVENTS * 100 / 94 / THREADS))

LOADERS=()
stop_load() { for p in "${LOADERS[@]}"; do kill "$p" 2>/dev/null || true; done; }
on_exit stop_load
for _ in $(seq "$LOAD"); do
	sh -c 'while :; do :; done' &
	LOADERS+=($!)
done

# run NAME BINARY: one traced run, its figures on one line.
run() {
	local name=$1 bin=$2
	rm -f "$W/t.trace"
	"$bin" record --lib "$LIB" -o "$W/t.trace" -- "$W/mix" "$THREADS" "$ITERS" 7 >"$W/mix.out" 2>"$W/err" || {
		cat "$W/err" >&2
		return 1
	}
	local tally events lost nowin
	tally=$(grep -o 'allocs=[0-9]* frees=[0-9]* failed=[0-9]*' "$W/mix.out")
	"$bin" report --json "$W/t.trace" >"$W/r.json"
	events=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sum(p.get("allocs",0)+p.get("frees",0)+p.get("failed",0) for p in r.get("processes",[])))' "$W/r.json" 2>/dev/null || echo ?)
	lost=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("lost_events",0))' "$W/r.json")
	nowin=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r.get("counters",{}).get("ringbuf_no_window",0))' "$W/r.json")
	printf '%-10s mix %s | trace: %s events, lost %s, without window %s | load %s\n' \
		"$name" "$tally" "$events" "$lost" "$nowin" "$(cut -d' ' -f1-3 /proc/loadavg)"
}

for r in $(seq "$ROUNDS"); do
	echo "round $r: $THREADS threads, $ITERS iterations each, $LOAD busy loops"
	run cudatrace "$CUDATRACE"
	if [ -n "${BASELINE:-}" ]; then
		run baseline "$BASELINE"
	fi
done
