# Nested Python functions that allocate through ctypes into the runtime
# stand-in (vmtest/unwind_test.go): argv[1] is the library.
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])


def leaf():
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(3 << 20))  # LINE:leaf


def middle():
    return leaf()  # LINE:middle


def outer():
    return middle()  # LINE:outer


sys.exit(outer())
