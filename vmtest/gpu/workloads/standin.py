"""The suite's stand-in workload: cudaMalloc/cudaFree through ctypes on
whatever libcudart --lib names (the test stand-in on machines without a
GPU, the real one on a GPU machine), keeping its own account in the shape
the PyTorch workload writes, so suite.py's comparisons run the same way.
"""
import argparse
import ctypes
import os
import sys
import time

from truth import Truth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    rt = ctypes.CDLL(a.lib)
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    t = Truth(a.truth)
    live = {}

    # STANDIN_LIE: bytes to misreport, so a test can see the suite catch it.
    lie = int(os.environ.get("STANDIN_LIE", "0"))

    def reserved():
        return sum(live.values()) + lie

    def alloc(n):
        p = ctypes.c_void_p()
        rc = rt.cudaMalloc(ctypes.byref(p), n)
        if rc != 0:
            sys.exit("cudaMalloc(%d) = %d" % (n, rc))
        live[p.value] = n

    def free(addr):
        rc = rt.cudaFree(ctypes.c_void_p(addr))
        if rc != 0:
            sys.exit("cudaFree = %d" % rc)
        del live[addr]

    for r in range(a.rounds):
        for i in range(20):
            alloc((1 << 20) + 4096 * i + 512 * r)
        for addr in sorted(live)[::3]:
            free(addr)
        t.checkpoint("round %d" % r, reserved=reserved)
    t.set("segments", [{"address": k, "total_size": v, "device": 0} for k, v in sorted(live.items())])
    t.checkpoint("snapshot", reserved=reserved)
    t.save()
    time.sleep(0.3)  # the recorder reads our mappings at the first event


if __name__ == "__main__":
    main()
