# pyloop.py LIB N [GO]: N cudaMalloc(1 MiB) + cudaFree pairs through
# ctypes, eight Python frames deep, for bench/bpfcost.sh's Python rows and
# bench/readercpu.sh's. With GO, a path, it waits until that file exists
# before the loop: a tracer attached by --pid is then in place.
import ctypes
import os
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])
if len(sys.argv) > 3:
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
p = ctypes.c_void_p()
size = ctypes.c_size_t(1 << 20)


def step():
    lib.cudaMalloc(ctypes.byref(p), size)
    lib.cudaFree(p)


def deep(k):
    if k == 0:
        for _ in range(n):
            step()
        return
    deep(k - 1)


deep(6)
