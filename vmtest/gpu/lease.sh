#!/bin/bash
# vmtest/gpu/lease.sh OUT [SECONDS]: all that one call of a lent GPU machine
# runs, prepared here so the lease's few minutes go to measuring: the
# machine's facts, a smoke recording, an attach to a running PyTorch job
# exported for PyTorch's own viewer, then the suite (run.sh) in the order
# that matters most, cut off after SECONDS (default 420). Everything lands in
# OUT as at most 8 files (the device tool's limit): env.txt, smoke.txt,
# attach.txt, suite.txt, results.md, results.json, logs.tgz, traces.tgz.
# Needs bin/cudatrace (make build) carried along. CHECKS=a,b,... runs those
# suite checks only; PARTS=suite leaves out the smoke and attach parts;
# STEPS=N sets the training steps of the torch workloads (default 200).
set -u
out=${1:?usage: vmtest/gpu/lease.sh OUT [SECONDS]}
budget=${2:-420}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ct=$root/bin/cudatrace
py=${PYTHON:-python3}
work=/tmp/gpu-lease
rm -rf "$work"
mkdir -p "$out" "$work/suite"
start=$(date +%s)

{
	date -u
	uname -a
	nvidia-smi
	ls -la /sys/kernel/btf/vmlinux /sys/bus/event_source/devices/
	cat /proc/sys/kernel/perf_event_paranoid
	"$py" -c 'import sys, torch; print(sys.executable, sys.version); print("torch", torch.__version__, torch.version.cuda, torch.cuda.is_available())'
	for m in jax cupy numba; do "$py" -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
	tdir=$("$py" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
	echo "libtorch_cuda's CUDA libraries:"
	ldd "$tdir/lib/libtorch_cuda.so" | grep -i -E 'cud|nvidia|c10'
	echo "CUDA libraries on the machine:"
	find / -xdev \( -name 'libcudart.so*' -o -name 'libcuda.so*' -o -name 'libnvidia-ml.so*' \) 2>/dev/null | head -40
	"$ct" --version
} >"$out/env.txt" 2>&1

parts=${PARTS:-smoke,attach,suite}
checks=${CHECKS:-torch-native,torch-stacks,torch-memviz,torch-oom,torch-expandable,torch-async,nvml,cupy-pool,cupy-nopool,jax-platform,jax-bfc,overhead}

# Smoke: one tensor, recorded from the first instruction.
case ,$parts, in *,smoke,*) ;; *) false ;; esac && {
cat >"$work/smoke.py" <<'EOF'
import torch
x = torch.empty(1 << 26, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ptr", hex(x.data_ptr()), "allocated", torch.cuda.memory_allocated(), "reserved", torch.cuda.memory_reserved())
EOF
{
	echo "\$ cudatrace record -v -o smoke.trace -- python3 smoke.py"
	timeout 120 "$ct" record -v -o "$work/smoke.trace" -- "$py" "$work/smoke.py"
	echo "rc=$?"
	timeout 60 "$ct" report "$work/smoke.trace"
	timeout 60 "$ct" report "$work/smoke.trace" --json >"$work/smoke.report.json"
	echo "report rc=$?"
} >"$out/smoke.txt" 2>&1
}

# Attach to a PyTorch job that has allocated before the attach, and hand
# the export to PyTorch's own viewer code (stats, trace_plot, segment_plot).
case ,$parts, in *,attach,*) ;; *) false ;; esac && {
cat >"$work/attach.py" <<'EOF'
import sys, time, torch
keep = [torch.empty(8 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
torch.cuda.synchronize()
print("ready", torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), flush=True)
time.sleep(4)  # cudatrace attaches now
for i in range(20):
    keep.append(torch.empty((i + 1) << 20, dtype=torch.uint8, device="cuda"))
    if i % 3 == 0:
        del keep[0]
    time.sleep(0.05)
torch.cuda.synchronize()
print("end", torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), flush=True)
time.sleep(1)
EOF
{
	"$py" "$work/attach.py" >"$work/attach.out" 2>&1 &
	job=$!
	for _ in $(seq 100); do grep -q ready "$work/attach.out" 2>/dev/null && break; sleep 0.2; done
	echo "\$ cudatrace record --pid $job -o attach.trace"
	timeout 60 "$ct" record -v --pid "$job" -o "$work/attach.trace"
	echo "rc=$?"
	wait $job
	cat "$work/attach.out"
	"$ct" report "$work/attach.trace"
	for kind in memviz; do
		"$ct" export "$work/attach.trace" --format memviz -o "$work/attach.pickle"
		echo "export rc=$?"
	done
	for verb in stats trace_plot segment_plot; do
		echo "\$ python -m torch.cuda._memory_viz $verb attach.pickle"
		if [ $verb = stats ]; then
			"$py" -m torch.cuda._memory_viz stats "$work/attach.pickle" 2>&1 | tail -20
		else
			"$py" -m torch.cuda._memory_viz $verb "$work/attach.pickle" -o "$work/attach.$verb.html" 2>&1 | tail -20
		fi
		echo "rc=${PIPESTATUS[0]}"
	done
} >"$out/attach.txt" 2>&1
}

left=$((budget - ($(date +%s) - start)))
[ "$left" -ge 60 ] || left=60
echo "suite: $left s left" >"$out/suite.txt"
PYTHON=$py timeout "$left" "$here/run.sh" "$work/suite" --steps "${STEPS:-200}" --timeout 150 \
	--only "$checks" \
	>>"$out/suite.txt" 2>&1
echo "suite rc=$?" >>"$out/suite.txt"
cp "$work/suite/results.md" "$work/suite/results.json" "$out/" 2>/dev/null
(cd "$work" && tar czf "$out/logs.tgz" --exclude='*.trace' --exclude='*.html' .)
# Traces, smallest first, as many as fit in 15 MiB.
(cd "$work" && ls -S -r $(find . -name '*.trace') 2>/dev/null | awk -v max=$((15 << 20)) \
	'{ cmd = "stat -c %s " $1; cmd | getline s; close(cmd); if (t + s < max) { t += s; print $1 } }' \
	| tar czf "$out/traces.tgz" -T -)
ls -la "$out"
