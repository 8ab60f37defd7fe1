"""What a workload knows of its own memory, written for suite.py to compare.

Each checkpoint is taken in a quiet moment: the GPU is synchronized, then
the workload pauses QUIET seconds on both sides of reading its figures, so
no allocation lies near the checkpoint's time and the trace, read at that
time, holds exactly what the framework held.
"""
import json
import os
import subprocess
import time

QUIET = 0.05


class Truth:
    def __init__(self, path):
        self.path = path
        self.doc = {"pid": os.getpid(), "checkpoints": []}

    def checkpoint(self, label, sync=None, **figures):
        """figures: name -> value, or a callable read at the checkpoint."""
        if sync:
            sync()
        time.sleep(QUIET)
        cp = {"label": label, "wall_ns": time.time_ns()}
        for k, v in figures.items():
            cp[k] = v() if callable(v) else v
        time.sleep(QUIET)
        self.doc["checkpoints"].append(cp)
        return cp

    def set(self, key, value):
        self.doc[key] = value

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(tmp, self.path)


def nvml_used(pid=None):
    """The driver's figure for this process's GPU memory (nvidia-smi), in
    bytes; None where nvidia-smi is missing or does not list it."""
    pid = pid or os.getpid()
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    total = None
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            total = (total or 0) + int(parts[1]) * (1 << 20)  # MiB
    return total
