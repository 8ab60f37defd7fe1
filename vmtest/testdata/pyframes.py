# Nested Python functions allocating through ctypes into the runtime
# stand-in, and a thread without Python frames (vmtest/python_test.go).
# argv[1] is the stand-in, argv[2] pythread.c built. LINE:tag marks the
# line a frame must report.
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
threads = ctypes.CDLL(sys.argv[2])
size = ctypes.c_size_t


def warmup():
    # The first record: BPF walks its Python frames too, since the
    # interpreter's layout is taught to BPF before the command runs
    # (nothing is stopped for it).
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), size(1 << 20))  # LINE:warmup


class Model:
    def leaf(self):
        p = ctypes.c_void_p()
        return lib.cudaMalloc(ctypes.byref(p), size(3 << 20))  # LINE:leaf

    def middle(self):
        return self.leaf()  # LINE:middle


def outer():
    return Model().middle()  # LINE:outer


rc = warmup() or outer()  # LINE:main
rc = rc or threads.alloc_on_thread(size(5 << 20))
# Code objects are read while the process lives: stay a moment.
time.sleep(1)
sys.exit(rc)
