"""Numba's CUDA target (Debian's python3-numba, ctypes over the stand-in
driver named by NUMBA_CUDA_DRIVER) with a tracer attached to it after it
allocated and set its contexts, for vmtest/numba_test.go.

Before the go line on stdin: the main thread allocates on device 0, and a
second thread enters cuda.gpus[1] (device 1's primary context pushed) and
allocates there. Then "ready" on stdout; after the go line (the marker
PHASE2 in the stand-in's log): the main thread allocates on device 0 and,
inside cuda.gpus[1], on device 1; the second thread, still inside its
cuda.gpus[1], allocates on device 1. Each allocating line after the go
line is marked."""
import ctypes
import os
import sys
import threading

import numpy as np
from numba import cuda

driver = ctypes.CDLL(os.environ["NUMBA_CUDA_DRIVER"])
go = threading.Event()
ready = threading.Event()
held = {}


def worker():
    with cuda.gpus[1]:
        held["early1"] = cuda.device_array(1 << 16, dtype=np.uint8)
        ready.set()
        go.wait()
        held["thread1"] = cuda.device_array(1 << 19, dtype=np.uint8)  # LINE:thread1


early0 = cuda.device_array(1 << 17, dtype=np.uint8)
t = threading.Thread(target=worker)
t.start()
ready.wait()
print("ready", flush=True)
sys.stdin.readline()
driver.fakecuda_log_marker(b"PHASE2")

main0 = cuda.device_array(1 << 18, dtype=np.uint8)  # LINE:main0
with cuda.gpus[1]:
    main1 = cuda.device_array(1 << 20, dtype=np.uint8)  # LINE:main1
host = cuda.pinned_array(1 << 12, dtype=np.float64)  # LINE:pinned
again0 = cuda.to_device(np.zeros(1 << 15, dtype=np.float32))  # LINE:to_device
go.set()
t.join()
print("numba_attach: done", flush=True)
# Alive until stdin closes: an attached process is not held for its new
# Python frames to be read (issue 18), and exiting at once frees them.
sys.stdin.readline()
