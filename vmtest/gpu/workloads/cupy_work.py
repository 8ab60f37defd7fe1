"""CuPy: arrays made and dropped with its default memory pool (segments are
the pool's cudaMalloc'ed chunks: total_bytes) or without a pool (each array
is one cudaMalloc: the live arrays' nbytes)."""
import argparse
import time

import cupy

from truth import Truth


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    ap.add_argument("--pool", choices=["default", "none"], default="default")
    a = ap.parse_args()
    if a.pool == "none":
        cupy.cuda.set_allocator(None)
    pool = cupy.get_default_memory_pool()
    t = Truth(a.truth)
    sync = cupy.cuda.runtime.deviceSynchronize
    live = []
    for r in range(4):
        for i in range(16):
            live.append(cupy.ones((1 << 18) + 1000 * i + r, dtype=cupy.float32))
        del live[::3]
        t.checkpoint("round %d" % r, sync, reserved=lambda: pool.total_bytes() if a.pool == "default" else
                     sum(x.nbytes for x in live), used=pool.used_bytes,
                     arrays=lambda: sum(x.nbytes for x in live))
    t.save()
    time.sleep(0.3)


if __name__ == "__main__":
    main()
