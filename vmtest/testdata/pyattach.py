# A Python process cudatrace attaches to (--pid) before it allocates
# (vmtest/python_test.go): it loads the stand-in (argv[1]), says "ready",
# waits for a line on stdin, then allocates from nested functions. LINE:tag
# marks the line a frame must report.
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])


def leaf():
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(7 << 20))  # LINE:leaf


def outer():
    return leaf()  # LINE:outer


print("ready", flush=True)
sys.stdin.readline()
rc = outer()  # LINE:main
# Code objects are read while the process lives: stay a moment.
time.sleep(1)
sys.exit(rc)
