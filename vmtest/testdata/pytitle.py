# A worker that renames itself as Ray's do (vmtest/title_test.go): before
# anything else it calls setproctitle, which writes "ray::Worker" over the
# memory its arguments and environment were laid out in. Then it says
# "ready" and, for each line on stdin, loads the runtime stand-in
# (argv[1]) the first time and allocates the bytes the line gives,
# answering "ok": its first CUDA call comes after the rename.
import setproctitle

setproctitle.setproctitle("ray::Worker")

import ctypes  # noqa: E402
import sys  # noqa: E402

print("ready", flush=True)
lib = None
held = []
for line in sys.stdin:
    if lib is None:
        lib = ctypes.CDLL(sys.argv[1])
    p = ctypes.c_void_p()
    rc = lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(int(line)))
    held.append(p)
    print("ok" if rc == 0 else "error %d" % rc, flush=True)
