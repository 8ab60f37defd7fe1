#!/usr/bin/env bash
# Time spent inside cudatrace's allocation return probe (ct_exit) per call,
# by stack window size, from the kernel's own BPF run-time statistics: unlike
# the end-to-end ratios of overhead.sh, noisy neighbours barely move it.
# Turns kernel.bpf_stats_enabled on for the run and restores it after.
# With PYTHON=/path/to/python3.X (CPython 3.10-3.13) the workload is
# bench/pyloop.py instead, eight Python frames deep, recorded with and
# without --no-python-frames, --stack-window 0: the cost of walking the
# interpreter's frames alone.
# Needs root, gcc, bpftool, jq. Usage: bench/bpfcost.sh [PAIRS] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=${1:-50000}
ROUNDS=${2:-3}
CUDATRACE=${CUDATRACE:-bin/cudatrace}
W=$(mktemp -d)
old=$(sysctl -n kernel.bpf_stats_enabled)
trap 'sysctl -q -w kernel.bpf_stats_enabled="$old"; rm -rf "$W"' EXIT
sysctl -q -w kernel.bpf_stats_enabled=1

gcc -shared -fPIC -O2 -fomit-frame-pointer -pthread -Wl,-soname,libcudart.so.12 \
	-Wl,--version-script=vmtest/testdata/fakecudart.map -o "$W/libcudart.so.12" vmtest/testdata/fakecudart.c
ln -s libcudart.so.12 "$W/libcudart.so"
gcc -O2 -fno-omit-frame-pointer -I vmtest/testdata -o "$W/loop" bench/loop.c -L"$W" -lcudart -Wl,-rpath,"$W"

# cost WINDOW: mean ns per ct_exit run over one recording, sampled until
# the recording's programs are gone.
cost() {
	# This recording's program is the ct_exit that was not loaded before
	# it: other tracers may be running (bpftool here does not list pids).
	local before
	before=$(bpftool -j prog show name ct_exit 2>/dev/null | jq -c '[if type == "array" then .[] else . end | .id]' 2>/dev/null || echo '[]')
	[ -n "$before" ] || before='[]'
	local cmd=("$W/loop" "$PAIRS") extra=()
	if [ -n "${PYTHON:-}" ]; then
		cmd=("$PYTHON" bench/pyloop.py "$W/libcudart.so.12" "$PAIRS")
		[ "$2" = off ] && extra=(--no-python-frames)
	fi
	"$CUDATRACE" record -q --stack-window "$1" "${extra[@]}" --lib "$W/libcudart.so.12" -- "${cmd[@]}" >/dev/null 2>"$W/err" &
	local rec=$! last=""
	while kill -0 $rec 2>/dev/null; do
		s=$(bpftool -j prog show name ct_exit 2>/dev/null | jq -r --argjson b "$before" '[if type == "array" then .[] else . end
			| select(.run_cnt != null and (.id as $i | $b | index($i) | not))][0]
			| select(. != null) | "\(.run_time_ns) \(.run_cnt)"' 2>/dev/null || true)
		[ -n "$s" ] && last=$s
		sleep 0.05
	done
	wait $rec || true
	grep -E 'lost' "$W/err" >&2 || true
	awk -v s="$last" 'BEGIN { split(s, a, " "); if (a[2] > 0) printf "%.0f", a[1] / a[2]; else print "?" }'
}

declare -A all
if [ -n "${PYTHON:-}" ]; then
	for r in $(seq "$ROUNDS"); do
		line="round $r:"
		for py in on off; do
			c=$(cost 0 $py); all[$py]+="$c "; line+=" python-frames=$py ${c}ns"
		done
		echo "$line" >&2
	done
	median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
	printf '%-14s %18s\n' python-frames "ns per ct_exit"
	for py in on off; do printf '%-14s %18s\n' "$py" "$(echo "${all[$py]}" | median)"; done
	echo "($("$PYTHON" -V), --stack-window 0, $PAIRS pairs per recording, median of $ROUNDS rounds, $(nproc) CPUs, $(uname -r))"
	exit 0
fi
for r in $(seq "$ROUNDS"); do
	line="round $r:"
	for w in 0 4KiB 16KiB 64KiB; do
		c=$(cost $w); all[$w]+="$c "; line+=" window=$w ${c}ns"
	done
	echo "$line" >&2
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-8s %18s\n' window "ns per ct_exit"
for w in 0 4KiB 16KiB 64KiB; do printf '%-8s %18s\n' "$w" "$(echo "${all[$w]}" | median)"; done
echo "($PAIRS pairs per recording, median of $ROUNDS rounds, $(nproc) CPUs, $(uname -r))"
