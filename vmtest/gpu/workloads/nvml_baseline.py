"""The CUDA context's own cost: a process that initializes CUDA through
PyTorch and holds one small tensor. NVML's figure for it, less what was
traced, is what no allocation call accounts for (context, module images);
suite.py expects the training run to leave the same remainder."""
import argparse
import time

import torch

from truth import Truth, nvml_used


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    a = ap.parse_args()
    t = Truth(a.truth)
    x = torch.ones(1 << 18, device="cuda")  # 1 MiB
    t.checkpoint("baseline", torch.cuda.synchronize, allocated=torch.cuda.memory_allocated,
                 reserved=torch.cuda.memory_reserved, nvml_used=nvml_used)
    t.save()
    del x
    time.sleep(0.3)


if __name__ == "__main__":
    main()
