#!/usr/bin/env bash
# Time spent inside cudatrace's allocation return probe (ct_exit) per call,
# by stack window size, from the kernel's own BPF run-time statistics: unlike
# the end-to-end ratios of overhead.sh, noisy neighbours barely move it.
# The loop runs 64 KiB below the top of its stack, so that every window is
# copied whole; "16KiB-shallow" is the default window on bench/loop.c with
# no stack above main's frame, where the copy stops at the stack's end.
# Turns kernel.bpf_stats_enabled on for the run and restores it after.
# With PYTHON=/path/to/python3.X (CPython 3.10-3.13) the workload is
# bench/pyloop.py instead, eight Python frames deep, recorded with and
# without --no-python-frames, --stack-window 0: the cost of walking the
# interpreter's frames alone, as the ratio of the two.
# With BASELINE=/path/to/cudatrace, that build is measured too, in the
# same rounds (before/after).
# Needs root, gcc, bpftool, jq. Usage: bench/bpfcost.sh [PAIRS] [ROUNDS]
PAIRS=${1:-50000}
ROUNDS=${2:-3}
. "$(dirname "$0")/lib.sh"
bpf_stats_on
build_loop

# cost BINARY WINDOW [on|off]: mean ns per ct_exit run over one recording,
# sampled until the recording's programs are gone.
cost() {
	# This recording's program is the ct_exit that was not loaded before
	# it: other tracers may be running (bpftool here does not list pids).
	local before
	before=$(bpftool -j prog show name ct_exit 2>/dev/null | jq -c '[if type == "array" then .[] else . end | .id]' 2>/dev/null || echo '[]')
	[ -n "$before" ] || before='[]'
	local cmd=("$W/loop" "$PAIRS") extra=() window=$2
	if [ "$window" = 16KiB-shallow ]; then
		cmd=("$W/loop-shallow" "$PAIRS")
		window=16KiB
	fi
	if [ -n "${PYTHON:-}" ]; then
		cmd=("$PYTHON" bench/pyloop.py "$LIB" "$PAIRS")
		[ "$3" = off ] && extra=(--no-python-frames)
	fi
	"$1" record -q --stack-window "$window" "${extra[@]}" --lib "$LIB" -- "${cmd[@]}" >/dev/null 2>"$W/err" &
	local rec=$! samples="$W/samples"
	: >"$samples"
	while kill -0 $rec 2>/dev/null; do
		bpftool -j prog show name ct_exit 2>/dev/null | jq -r --argjson b "$before" '[if type == "array" then .[] else . end
			| select(.run_cnt != null and .run_cnt > 0 and (.id as $i | $b | index($i) | not))][]
			| "\(.id) \(.run_time_ns) \(.run_cnt)"' >>"$samples" 2>/dev/null || true
		sleep 0.05
	done
	wait $rec || true
	grep -E 'lost' "$W/err" >&2 || true
	# Other tracers (other users' recordings) may have loaded a ct_exit of
	# their own meanwhile: this recording's is the one whose last sample
	# counts the most runs, at most one per pair.
	awk -v max=$((PAIRS + 16)) '$3 <= max { t[$1] = $2; c[$1] = $3 }
		END { best = ""; for (i in c) if (best == "" || c[i] > c[best]) best = i
		      if (best != "" && c[best] > 0) printf "%.0f", t[best] / c[best]; else print "?" }' "$samples"
}

BUILDS=(cudatrace)
[ -n "${BASELINE:-}" ] && BUILDS+=(baseline)
bin() { if [ "$1" = baseline ]; then echo "$BASELINE"; else echo "$CUDATRACE"; fi; }
declare -A all last
if [ -n "${PYTHON:-}" ]; then
	for r in $(seq "$ROUNDS"); do
		line="round $r:"
		for b in "${BUILDS[@]}"; do
			for py in on off; do
				c=$(cost "$(bin "$b")" 0 $py); all[$b/$py]+="$c "; last[$py]=$c; line+=" $b python-frames=$py ${c}ns"
			done
			# on and off back to back: their ratio within the round
			all[$b/rr]+="$(ratio "${last[on]}" "${last[off]}") "
		done
		echo "$line" >&2
	done
	# The rounds' own ratios beside the ratio of the medians: on this VM a
	# round's "off" alone moves by half, and their spread says how far the
	# medians can be trusted.
	printf '%-10s %12s %12s %8s %22s\n' build "frames on" "frames off" "on/off" "per round: median, range"
	for b in "${BUILDS[@]}"; do
		on=$(echo "${all[$b/on]}" | median)
		off=$(echo "${all[$b/off]}" | median)
		rr=$(echo "${all[$b/rr]}" | tr ' ' '\n' | grep -v '^?*$' | sort -n | tr '\n' ' ')
		printf '%-10s %12s %12s %8s %22s\n' "$b" "$on" "$off" "$(ratio "$on" "$off")" \
			"$(echo "$rr" | median) ($(echo "$rr" | awk '{print $1 "-" $NF}'))"
	done
	echo "(CUDATRACE=$CUDATRACE${BASELINE:+ BASELINE=$BASELINE} PYTHON=$PYTHON bench/bpfcost.sh $PAIRS $ROUNDS: ns per ct_exit run, $("$PYTHON" -V), --stack-window 0, median of $ROUNDS interleaved rounds, $(nproc) CPUs, $(uname -r))"
	exit 0
fi
for r in $(seq "$ROUNDS"); do
	line="round $r:"
	for b in "${BUILDS[@]}"; do
		for w in 0 4KiB 16KiB 16KiB-shallow 64KiB; do
			c=$(cost "$(bin "$b")" $w); all[$b/$w]+="$c "; line+=" $b window=$w ${c}ns"
		done
	done
	echo "$line" >&2
done
printf '%-10s %14s %18s\n' build window "ns per ct_exit"
for b in "${BUILDS[@]}"; do
	for w in 0 4KiB 16KiB 16KiB-shallow 64KiB; do printf '%-10s %14s %18s\n' "$b" "$w" "$(echo "${all[$b/$w]}" | median)"; done
done
echo "(CUDATRACE=$CUDATRACE${BASELINE:+ BASELINE=$BASELINE} bench/bpfcost.sh $PAIRS $ROUNDS: $PAIRS pairs per recording, median of $ROUNDS rounds, $(nproc) CPUs, $(uname -r))"
