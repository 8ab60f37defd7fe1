#!/usr/bin/env bash
# What a code object's first sight costs a CPython process, per
# allocation, as ratios side by side in one run (never quote a lone time):
# a process allocating from N new Python frames (a model loading: each a
# code object the probe captures, bpf/pycode.h), then M times from one
# (steady state), under `record --all` of two binaries, interleaved round
# by round with the program alone:
#   untraced   the program alone
#   base       $BASE record --all (e.g. a build before the captures, which
#              held a process without a terminal at each new Python frame
#              until its reader had read the code object)
#   cudatrace  $CUDATRACE record --all (captures at first sight in BPF;
#              nothing waits for the reader)
# Needs root, gcc, a python3 (PYTHON). Usage: bench/pyfirst.sh [N] [M] [ROUNDS]
N=${1:-200}
M=${2:-2000}
ROUNDS=${3:-3}
BASE=${BASE:?BASE=path of the cudatrace binary to compare with}
PYTHON=${PYTHON:-python3}
. "$(dirname "$0")/lib.sh"
export FAKECUDA_LOG=/dev/null

# run BIN: the program under BIN record --all ("" alone), without a
# controlling terminal (setsid), as a job under the agent.
run() {
	if [ -z "$1" ]; then
		setsid "$PYTHON" bench/pyburst.py "$LIB" "$N" "$M" </dev/null
		return
	fi
	"$1" record --all --lib "$LIB" -o "$W/t.trace" >"$W/rec.out" 2>"$W/rec.err" &
	local r=$!
	for _ in $(seq 200); do grep -q attached "$W/rec.err" && break; sleep 0.05; done
	setsid "$PYTHON" bench/pyburst.py "$LIB" "$N" "$M" </dev/null
	kill -INT $r
	wait $r || true
	grep -h "lost" "$W/rec.out" "$W/rec.err" | head -1 || true
}

echo "mode       new-frame-us steady-us (per allocation)"
for round in $(seq "$ROUNDS"); do
	for mode in untraced base cudatrace; do
		case $mode in
		untraced) bin= ;;
		base) bin=$BASE ;;
		cudatrace) bin=$CUDATRACE ;;
		esac
		printf '%-10s %s\n' "$mode" "$(run "$bin" | sed 's/new \([0-9.]*\) steady \([0-9.]*\)/\1 \2/')"
	done
done
