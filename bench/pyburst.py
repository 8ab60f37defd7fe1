# A model-loading-like burst (bench/pyfirst.sh): N new code objects each
# allocating once (N new Python frames), then M allocations from one site.
# argv: the runtime library, N, M. Prints microseconds per allocation.
import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
N, M = int(sys.argv[2]), int(sys.argv[3])
def malloc(n):
    p = ctypes.c_void_p()
    lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    lib.cudaFree(p)
fns = []
for i in range(N):
    ns = {"malloc": malloc}
    exec(f"def load_{i}(n):\n    return malloc(n)\n", ns)
    fns.append(ns[f"load_{i}"])
malloc(1 << 10)  # first sight
t0 = time.perf_counter_ns()
for f in fns:
    f(1 << 10)
t1 = time.perf_counter_ns()
for _ in range(M):
    malloc(1 << 10)
t2 = time.perf_counter_ns()
print(f"new {(t1-t0)/N/1000:.1f} steady {(t2-t1)/M/1000:.1f}")
