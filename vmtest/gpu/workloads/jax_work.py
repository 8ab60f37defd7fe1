"""JAX: arrays made and dropped on the first GPU. XLA_PYTHON_CLIENT_* comes
from suite.py: with the platform allocator every buffer is its own driver
allocation (live = the arrays' bytes, as memory_stats counts them); with
XLA's BFC pool the segments are its regions (memory_stats' pool_bytes)."""
import argparse
import time

import jax
import jax.numpy as jnp

from truth import Truth


def stats(dev):
    s = dev.memory_stats() or {}
    return {k: int(v) for k, v in s.items() if isinstance(v, (int, float))}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--truth", required=True)
    a = ap.parse_args()
    dev = jax.devices("gpu")[0]
    t = Truth(a.truth)
    live = []

    def sync():
        for x in live:
            x.block_until_ready()

    for r in range(4):
        for i in range(16):
            live.append(jax.device_put(jnp.ones(((1 << 18) + 1000 * i + r,), dtype=jnp.float32), dev))
        del live[::3]
        t.checkpoint("round %d" % r, sync, stats=lambda: stats(dev),
                     arrays=lambda: sum(x.nbytes for x in live))
    t.save()
    time.sleep(0.3)


if __name__ == "__main__":
    main()
