#!/usr/bin/env bash
# Memory of `cudatrace agent` over a churn of short-lived traced processes:
# each one makes 7 calls (allocations it does not free, a failed call, a
# free) and exits. The agent runs twice, side by side in one run:
#   aging     --retention 2s: exited processes are forgotten
#   keep-all  --retention 24h: nothing is forgotten (what aging saves)
# At checkpoints it records the agent's RSS (/proc/PID/status VmRSS), its
# Go heap in use and the stacks and processes it holds (from /metrics).
# Needs root and gcc. Usage: bench/agent-churn.sh [PROCESSES] [CHECKPOINTS]
N=${1:-5000}
STEPS=${2:-5}
AGENT=
. "$(dirname "$0")/lib.sh"
on_exit '[ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null'
gcc -O0 -fno-omit-frame-pointer -I vmtest/testdata -o "$W/shortlived" vmtest/testdata/shortlived.c \
	-L"$W" -lcudart -Wl,-rpath,"$W"

metric() { curl -s "$URL/metrics" | awk -v m="$1" '$1 == m {printf "%d", $2}'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$AGENT/status"; }
row() {
	printf '%-9s %9s %9s %12s %8s %9s %8s\n' "$1" "$2" "$(rss_kib)" \
		"$(( $(metric go_memstats_heap_inuse_bytes) / 1024 ))" "$(metric cudatrace_stacks)" \
		"$(metric cudatrace_processes_exited_total)" "$(metric cudatrace_lost_events_total)"
}

run() { # MODE RETENTION
	: >"$W/agent.out"
	"$CUDATRACE" agent --listen 127.0.0.1:0 --lib "$LIB" --dump-dir "" --retention "$2" \
		>"$W/agent.out" 2>&1 &
	AGENT=$!
	for _ in $(seq 200); do grep -q 'cudatrace: attached' "$W/agent.out" && break; sleep 0.05; done
	URL=$(sed -n 's|.*serving \(http://[0-9.:]*\)/.*|\1|p' "$W/agent.out")
	row "$1" 0
	local done=0 per=$(( N / STEPS ))
	for _ in $(seq "$STEPS"); do
		for _ in $(seq "$per"); do "$W/shortlived"; done
		done=$(( done + per ))
		sleep 3 # the exits are noticed within 1 s, forgotten 2 s later with aging
		row "$1" "$done"
	done
	kill -TERM "$AGENT"; wait "$AGENT" || true
	AGENT=
}

printf '%-9s %9s %9s %12s %8s %9s %8s\n' mode processes "rss KiB" "heap KiB" stacks exited lost
run aging 2s
run keep-all 24h
echo "($N short-lived processes of 7 traced calls each, $(nproc) CPUs, $(uname -r))"
