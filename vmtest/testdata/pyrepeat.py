# A Python loop of cudaMalloc/cudaFree pairs through ctypes for argv[2]
# seconds (vmtest/python_test.go TestPythonCapturedOnce,
# unwind_bpf_test.go TestUnwindInBPFCPython): it maps nothing
# after its start, and CPython and libffi keep no frame pointers, so the
# frame-pointer walk of every record reads data as return addresses.
# argv[1] is the stand-in. Prints "pairs=N" at the end.
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
end = time.monotonic() + float(sys.argv[2])
p = ctypes.c_void_p()
n = 0
while time.monotonic() < end:
    if lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20)) or lib.cudaFree(p):
        sys.exit(1)
    n += 1
print(f"pairs={n}", flush=True)
