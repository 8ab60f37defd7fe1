"""A small CNN trained on random data: the PyTorch workload of the suite.

Its truth: memory_allocated (tensors) and memory_reserved (segments) at
checkpoints, the caching allocator's own segments at the end
(torch.cuda.memory._snapshot()), the line that allocates a known tensor,
step times, and optionally NVML's figure for the process. The allocator
backend comes from PYTORCH_CUDA_ALLOC_CONF, set by suite.py.
"""
import argparse
import inspect
import os
import statistics
import time

import torch
import torch.nn as nn

from truth import Truth, nvml_used


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(128 * 8 * 8, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x):
        return self.f(x)


# Longer than record's NVML interval (1 s by default), so its own samples
# see the 1 GiB tensor that nvidia-smi saw.
NVML_HOLD = 1.5


def big_tensor():
    return torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # the stack check looks for this line


def too_big():
    return torch.empty(1 << 46, dtype=torch.uint8, device="cuda")  # 64 TiB: out of memory


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--nvml", action="store_true", help="read NVML's figure at each checkpoint")
    ap.add_argument("--history", action="store_true", help="torch.cuda.memory._record_memory_history on")
    ap.add_argument("--oom", action="store_true", help="end with an allocation that cannot succeed")
    ap.add_argument("--snapshot", help="also _dump_snapshot() here at the end")
    a = ap.parse_args()

    if a.history:
        try:
            torch.cuda.memory._record_memory_history(max_entries=100000)
        except TypeError:
            torch.cuda.memory._record_memory_history(True)
    t = Truth(a.truth)
    sync = torch.cuda.synchronize
    # allocated counts the caching allocator's blocks (requests rounded up
    # to 512 bytes, or a whole block it chose not to split); requested the
    # bytes asked for, which is what its tensor probe reports.
    figures = {"allocated": torch.cuda.memory_allocated, "reserved": torch.cuda.memory_reserved,
               "requested": lambda: torch.cuda.memory_stats().get("requested_bytes.all.current")}
    if a.nvml:
        figures["nvml_used"] = nvml_used
    torch.manual_seed(0)
    model = Net().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    big = big_tensor()
    t.set("big_line", inspect.getsourcelines(big_tensor)[1] + 1)
    t.set("file", os.path.abspath(__file__))
    t.checkpoint("start", sync, **figures)
    steps = []
    for step in range(1, a.steps + 1):
        s0 = time.perf_counter()
        x = torch.randn(a.batch, 3, 32, 32, device="cuda")
        y = torch.randint(0, 10, (a.batch,), device="cuda")
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        sync()
        steps.append(time.perf_counter() - s0)
        if step % a.every == 0:
            t.checkpoint("step %d" % step, sync, **figures)
    warm = steps[len(steps) // 5:]
    t.set("step_ms_median", statistics.median(warm) * 1e3)
    t.set("steps", len(steps))
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").find("cudaMallocAsync") < 0:
        snap = torch.cuda.memory._snapshot()
        t.set("segments", [{"address": s["address"], "total_size": s["total_size"], "device": s["device"],
                            "segment_type": s.get("segment_type")} for s in snap["segments"]])
        if a.snapshot:
            torch.cuda.memory._dump_snapshot(a.snapshot)
    t.checkpoint("snapshot", sync, **figures)
    if a.nvml:
        # A known change after the kernels are loaded: NVML's figure must
        # move by what was traced, the rest (context, modules) staying put.
        extra = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        t.checkpoint("nvml +1GiB", sync, **figures)
        time.sleep(NVML_HOLD)  # long enough for record's own NVML sampler to see it
        del extra
        torch.cuda.empty_cache()
        t.checkpoint("nvml empty_cache", sync, **figures)
    if a.oom:
        try:
            too_big()
            t.set("oom", None)
        except torch.cuda.OutOfMemoryError:
            t.set("oom", {"size": 1 << 46, "line": inspect.getsourcelines(too_big)[1] + 1})
    t.save()
    del big
    time.sleep(0.3)


if __name__ == "__main__":
    main()
