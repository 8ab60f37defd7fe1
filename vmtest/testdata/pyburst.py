# A Python job whose first allocations come in a burst, right as it
# starts, and end in an OOM, after which it exits
# (vmtest/agent_python_test.go): the agent must give every one of them its
# Python frames, and the OOM black box the failing line. argv[1] is the
# stand-in, argv[2] a size the stand-in refuses. LINE:tag marks the line a
# frame must report.
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
print("ready", flush=True)


def load(n):
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))  # LINE:load


for i in range(20):
    load(1 << 20)  # LINE:burst
rc = load(int(sys.argv[2]))  # LINE:oom
sys.exit(0 if rc == 2 else 1)  # cudaErrorMemoryAllocation
