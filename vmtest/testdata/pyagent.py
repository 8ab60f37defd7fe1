# A Python job for the agent (vmtest/agent_python_test.go): two functions
# allocate through ctypes into the runtime stand-in, a third asks for more
# than the stand-in has (an OOM). argv[1] is the stand-in. It waits for a
# line on stdin before each step and answers on stdout. LINE:tag marks the
# line a frame must report.
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
size = ctypes.c_size_t
held = []


def cuda_malloc(n):
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), size(n))  # LINE:malloc
    held.append(p)
    return rc


def load_weights(n):
    return cuda_malloc(n)  # LINE:weights


def alloc_activations(n):
    return cuda_malloc(n)  # LINE:activations


def grow(n):
    return cuda_malloc(n)  # LINE:grow


# The first record's Python frames too: BPF knows the interpreter's
# layout from the agent's start (it learns the installed ones before it
# says it attached) and walks them from the first record, stopping nothing.
cuda_malloc(1 << 20)  # LINE:warmup
print("ready", flush=True)
for line in sys.stdin:
    what, n = line.split()
    rc = {"weights": load_weights, "activations": alloc_activations, "grow": grow}[what](int(n))  # LINE:loop
    print("ok" if rc == 0 else "error %d" % rc, flush=True)
