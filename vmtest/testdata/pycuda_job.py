"""PyCUDA (Debian's python3-pycuda, a C++ extension linked against
libcuda.so.1) allocating the ways it does, on the stand-in driver: device
memory, pitched memory, pinned host memory (written to, and mapped),
managed memory, gpuarrays (to_gpu, arithmetic that allocates its results,
frees), a DeviceMemoryPool (blocks held, an allocation larger than the
device: the pool frees what it holds and fails again, stop_holding), a
second context on device 1 and its detach while not current, and the
first context's detach at the end, which frees what it still holds.

With --attach the script says "ready" once its context on device 0 is
made and waits for a line on stdin (the tracer attaches meanwhile), then
pops and pushes that context; the part on device 1 is left out then.
With --attach1 its context is made on device 1 before the attach and
never named again after it: the device is what PyCUDA's own calls say,
and the context the one its final pop returns (then detached).

Before each allocating line the script names it in the stand-in's log
(fakecuda_log_marker, the stand-in's own export, not a CUDA call), so the
log says which line made each allocation; each such line is also marked
for vmtest/pycuda_test.go."""
import ctypes
import sys
import time

import numpy as np
import pycuda.driver as cuda
import pycuda.gpuarray as gpuarray
from pycuda.tools import DeviceMemoryPool

attach1 = sys.argv[1:] == ["--attach1"]
attach = sys.argv[1:] == ["--attach"] or attach1
mark = ctypes.CDLL("libcuda.so.1").fakecuda_log_marker

cuda.init()
ctx0 = cuda.Device(1 if attach1 else 0).make_context()
if attach:
    print("ready", flush=True)
    sys.stdin.readline()
    mark(b"attached")
if attach and not attach1:
    # The tracer sees ctx0 made current (pushed) after it attached, and
    # its device asked for (as gpuarray does); a context current since
    # before the attach, never named again, is another matter.
    ctx0.pop()
    ctx0.push()
    assert cuda.Context.get_device().pci_bus_id() == cuda.Device(0).pci_bus_id()

mark(b"mem_alloc")
buf = cuda.mem_alloc(3 << 20)  # LINE:mem_alloc
mark(b"pitch")
pitched, pitch = cuda.mem_alloc_pitch(1000, 300, 4)  # LINE:pitch
assert pitch == 1024  # rows padded to the stand-in's 512-byte pitch alignment
free, total = cuda.mem_get_info()
assert total - free >= (3 << 20) + 300 * pitch  # device 0's memory in use
mark(b"pagelocked")
pinned = cuda.pagelocked_empty((256, 256), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)  # LINE:pagelocked
pinned[:] = 1.5
assert pinned.sum() == 1.5 * 256 * 256
assert pinned.base.get_device_pointer() == pinned.ctypes.data  # mapped: unified addressing
mark(b"managed")
managed = cuda.managed_empty(1 << 16, np.float32, mem_flags=cuda.mem_attach_flags.GLOBAL)  # LINE:managed
managed[:] = 2

mark(b"to_gpu")
x = gpuarray.to_gpu(pinned)  # LINE:to_gpu
mark(b"arith")
y = x * 2 + x  # LINE:arith
del y
mark(b"temp")
gpuarray.empty(1 << 18, np.float64).gpudata.free()  # LINE:temp

pool = DeviceMemoryPool()
mark(b"pool")
blocks = [pool.allocate(1 << 20) for _ in range(3)]  # LINE:pool
del blocks  # held by the pool
mark(b"pool_oom")
try:
    pool.allocate(3 << 30)  # LINE:pool_oom
except cuda.MemoryError as e:
    print("pycuda_job: out of memory:", e)
mark(b"pool_again")
kept = pool.allocate(1 << 21)  # LINE:pool_again
kept.free()  # back to the pool, held
pool.stop_holding()

if not attach:
    ctx1 = cuda.Device(1).make_context()
    mark(b"ctx1")
    on1 = cuda.mem_alloc(5 << 20)  # LINE:ctx1
    ctx1.pop()  # ctx0 is current again
    ctx1.detach()  # not current: pushed, detached; on1 goes with it
    mark(b"after_detach")
    after = cuda.mem_alloc(7 << 20)  # LINE:after_detach

ctx0.pop()  # with --attach1 the context popped is one made before the attach
ctx0.detach()  # the last use: what ctx0 still holds is freed with it
print("pycuda_job: done", flush=True)
if attach:
    time.sleep(1)  # the tracer reads code objects while the process lives
