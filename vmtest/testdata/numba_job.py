"""Numba's CUDA target (Debian's python3-numba, ctypes over libcuda.so.1)
allocating the ways it does, on the stand-in driver (NUMBA_CUDA_DRIVER):
device arrays, a deferred deallocation, pinned, mapped and managed host
arrays, an allocation larger than the device (Numba frees what it deferred
and retries, which fails again), an array on device 1 (cuda.gpus[1]: its
primary context pushed), and a second thread. Each allocating line is
marked for vmtest/numba_test.go."""
import threading

import numpy as np
from numba import cuda


def device_arrays():
    a = cuda.to_device(np.zeros(1 << 16, dtype=np.float32))  # LINE:to_device
    b = cuda.device_array(1 << 18, dtype=np.uint8)  # LINE:device_array
    return a, b


def host_arrays():
    p = cuda.pinned_array(1 << 12, dtype=np.float64)  # LINE:pinned
    m = cuda.mapped_array(1 << 12, dtype=np.float64)  # LINE:mapped
    g = cuda.managed_array(1 << 14, dtype=np.float32)  # LINE:managed
    return p, m, g


def worker():
    w = cuda.device_array(1 << 19, dtype=np.uint8)  # LINE:thread
    del w
    cuda.current_context().deallocations.clear()


keep = device_arrays()
with cuda.defer_cleanup():
    tmp = cuda.device_array(1 << 20, dtype=np.uint8)  # LINE:deferred
    del tmp
extra = host_arrays()
try:
    cuda.device_array(3 << 30, dtype=np.uint8)  # LINE:oom
except cuda.cudadrv.driver.CudaAPIError as e:
    print("numba_job: out of memory:", e)
with cuda.gpus[1]:
    on1 = cuda.device_array(1 << 20, dtype=np.uint8)  # LINE:gpu1
t = threading.Thread(target=worker)
t.start()
t.join()
print("numba_job: done")
