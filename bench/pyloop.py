# pyloop.py LIB N: N cudaMalloc(1 MiB) + cudaFree pairs through ctypes,
# eight Python frames deep, for bench/bpfcost.sh's Python rows.
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
n = int(sys.argv[2])
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
