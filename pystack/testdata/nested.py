# Nested functions; the innermost blocks in a C call made through ctypes
# (pause()), with the GIL released, as a CUDA allocation through ctypes
# would be. pystack's tests read this thread's Python stack meanwhile.
import ctypes
import sys
import threading

libc = ctypes.CDLL(None)


def leaf():
    sys.stdout.write("ready %d\n" % threading.get_native_id())
    sys.stdout.flush()
    return libc.pause()  # LINE:leaf


def middle():
    return leaf()  # LINE:middle


class Outer:
    def method(self):
        return middle()  # LINE:method


if sys.argv[1:] == ["thread"]:
    t = threading.Thread(target=Outer().method)
    t.start()
    t.join()  # LINE:join
else:
    Outer().method()  # LINE:module
