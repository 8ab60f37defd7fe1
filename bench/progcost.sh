#!/usr/bin/env bash
# Where a traced allocation/free pair's BPF time goes: every program's mean
# ns per run, from the kernel's own BPF run-time statistics, and their sum
# per pair, for the empty-probe floor (bpftrace, the probes of
# overhead.sh), cudatrace with --stack-window 0 and cudatrace's default
# (stacks unwound in BPF; CUDATRACE_UNWIND=window in the environment, or an
# older build, copies a 16 KiB window). The last column is what a mode's programs add to the
# floor's programs, as a share of the floor's whole pair (bench/loop.c's
# own ns per pair under the floor, in the same round): the part of
# overhead.sh's "x floor" that the probes' work alone explains, before the
# reader's CPU and the caches it shares. overhead.sh's target is 1.10x, so
# a share above 10% cannot meet it whatever the reader does.
# Programs are told from other tracers' by being held: only those whose
# file descriptors the mode's own process (cudatrace, bpftrace) holds
# count, so that another tracer loaded meanwhile (a CI run, another
# bench) is left out. Turns kernel.bpf_stats_enabled on for the run
# and restores it after.
# With BASELINE=/path/to/cudatrace, that build's default is measured too;
# BASELINE2=/path/to/another, as mode baseline2, beside it (a wrapper
# script that sets the environment measures another mode of a build).
# DEPTH=N builds the loop without frame pointers, N calls deeper (its
# stacks then N+5 frames or so: the loop's, libc's start).
# GATE=S holds the loop S seconds after it starts before its first pair
# (bench/loop.c's start file): a tracer that unwinds in BPF has the rows
# of its files loaded by then, and every record is unwound there, where
# without it the first records, made before, fall back to the window
# copy (and fill the ring) in proportions that vary from run to run.
# Needs root, gcc, bpftrace, bpftool, jq. Usage: bench/progcost.sh [PAIRS] [ROUNDS]
PAIRS=${1:-50000}
ROUNDS=${2:-3}
. "$(dirname "$0")/lib.sh"
bpf_stats_on
build_loop

# snap: "id name run_time_ns run_cnt" of every program that has run.
snap() {
	bpftool -j prog show 2>/dev/null | jq -r '[if type == "array" then .[] else . end
		| select(.run_cnt != null and .run_cnt > 0)][] | "\(.id) \(.name) \(.run_time_ns) \(.run_cnt)"' 2>/dev/null || true
}

# held PID: the ids of the BPF programs process PID holds a descriptor of.
held() { grep -h '^prog_id:' /proc/"$1"/fdinfo/* 2>/dev/null | awk '{ print $2 }' || true; }

# mine HELD AFTER: "name ns_total runs" of the programs in AFTER whose ids
# are in HELD, in the order of their ids; a name that comes again
# (bpftrace names a probe's entry and return programs alike) gets its turn
# after it: #2.
mine() {
	awk 'FILENAME == ARGV[1] { m[$1] = 1; next } ($1 in m) { print }' "$1" "$2" | sort -n |
		awk '{ n = ++seen[$2]; print (n > 1 ? $2 "#" n : $2), $3, $4 }'
}

# one MODE: runs the loop under MODE; writes $W/progs ("name ns runs") and
# prints the loop's ns per pair.
one() {
	local ids="$W/ids" after="$W/after"
	: >"$ids"
	: >"$after"
	case $1 in
	floor)
		bpftrace_start "$FLOOR"
		"$W/loop" "$PAIRS" >"$W/o"
		snap >"$after"
		held "$BT_PID" >"$ids"
		bpftrace_stop
		;;
	*)
		local bin=$CUDATRACE extra=()
		[ "$1" = baseline ] && bin=$BASELINE
		[ "$1" = baseline2 ] && bin=$BASELINE2
		[ "$1" = ct-nowin ] && extra=(--stack-window 0)
		local gate=()
		if [ -n "${GATE:-}" ]; then
			rm -f "$W/go"
			gate=("$W/go")
			(sleep "$GATE" && touch "$W/go") &
		fi
		"$bin" record -q "${extra[@]}" --lib "$LIB" -o "$W/t.trace" -- "$W/loop" "$PAIRS" "${gate[@]}" >"$W/o" 2>"$W/err" &
		local rec=$!
		# sampled until the recording's programs are gone: the last
		# sample has (nearly) every run
		while kill -0 $rec 2>/dev/null; do
			held $rec >>"$ids"
			snap >"$W/s"
			[ -s "$W/s" ] && cp "$W/s" "$after"
			sleep 0.05
		done
		wait $rec || true
		grep -E 'lost' "$W/err" | sed "s/^/$1: /" >&2 || true
		;;
	esac
	mine "$ids" "$after" >"$W/progs"
	ns_per_pair "$W/o"
}

MODES=(floor ct-nowin cudatrace)
[ -n "${BASELINE:-}" ] && MODES+=(baseline)
[ -n "${BASELINE2:-}" ] && MODES+=(baseline2)
declare -A pair prog names
for r in $(seq "$ROUNDS"); do
	line="round $r:"
	for m in "${MODES[@]}"; do
		p=$(one "$m")
		[ "$m" = floor ] && pair[$r]=$p
		# per program: ns per run; per mode: the sum over a pair
		sum=$(awk -v n="$PAIRS" '{ t += $2 } END { printf "%.0f", t / n }' "$W/progs")
		prog[$m/sum]+="$sum "
		while read -r name ns runs; do
			prog[$m/$name]+="$(awk -v t="$ns" -v c="$runs" 'BEGIN { printf "%.0f", t / c }') "
			prog[$m/$name/runs]=$runs
			case " ${names[$m]:-} " in *" $name "*) ;; *) names[$m]+="$name " ;; esac
		done <"$W/progs"
		line+=" $m ${sum}ns/pair"
	done
	echo "$line (floor's loop ${pair[$r]} ns/pair)" >&2
done

fsum=$(echo "${prog[floor/sum]}" | median)
fpair=$(echo "${pair[@]}" | median)
# min: the least of the rounds' means, the one least inflated by the
# program's preemption on a busy machine
printf '%-10s %-22s %12s %8s %10s\n' mode program "ns per run" "min" "runs"
for m in "${MODES[@]}"; do
	for name in $(echo "${names[$m]:-}" | tr " " "\n" | sort); do
		printf '%-10s %-22s %12s %8s %10s\n' "$m" "$name" "$(echo "${prog[$m/$name]}" | median)" \
			"$(echo "${prog[$m/$name]}" | tr ' ' '\n' | grep . | sort -n | head -1)" "${prog[$m/$name/runs]}"
	done
done
echo
printf '%-10s %14s %16s %22s\n' mode "BPF ns/pair" "- floor's" "% of a floor pair"
for m in "${MODES[@]}"; do
	s=$(echo "${prog[$m/sum]}" | median)
	printf '%-10s %14s %16s %22s\n' "$m" "$s" "$((s - fsum))" "$(awk -v d="$((s - fsum))" -v p="$fpair" 'BEGIN { printf "%.1f", 100 * d / p }')"
done
echo "(CUDATRACE=$CUDATRACE${BASELINE:+ BASELINE=$BASELINE}${BASELINE2:+ BASELINE2=$BASELINE2}${GATE:+ GATE=$GATE} bench/progcost.sh $PAIRS $ROUNDS: medians of $ROUNDS interleaved rounds; a floor pair ${fpair} ns; $(nproc) CPUs, $(uname -r))"
