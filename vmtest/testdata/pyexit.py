# Allocates through ctypes into the runtime stand-in and exits right after
# its last allocation (vmtest/python_exit_test.go): argv[1] is the
# stand-in, argv[2] how to end: "_exit" (os._exit, no interpreter
# teardown) or "exit" (a normal exit, which frees the module's code
# objects at once); with argv[3] "wait", it first reads a line from stdin
# (a --pid recording attaches meanwhile). The recorder reads code objects behind the process: a
# frame it reads too late must come out unresolved, never wrong. LINE:tag
# marks the line a frame must report.
import ctypes
import os
import sys

lib = ctypes.CDLL(sys.argv[1])
size = ctypes.c_size_t
if sys.argv[3:] == ["wait"]:
    sys.stdin.readline()


def alloc(n):
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), size(n))  # LINE:alloc


for i in range(15):
    alloc((i + 1) << 16)  # LINE:loop
for i in range(15):
    lib.cudaMalloc(ctypes.byref(ctypes.c_void_p()), size((i + 16) << 16))  # LINE:module
if sys.argv[2] == "_exit":
    os._exit(0)
