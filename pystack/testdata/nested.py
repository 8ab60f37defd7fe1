# Nested functions; the innermost blocks in a C call made through ctypes
# (pause()), with the GIL released, as a CUDA allocation through ctypes
# would be. pystack's tests read this thread's Python stack meanwhile.
import ctypes
import sys

libc = ctypes.CDLL(None)


def leaf():
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    return libc.pause()  # LINE:leaf


def middle():
    return leaf()  # LINE:middle


class Outer:
    def method(self):
        return middle()  # LINE:method


Outer().method()  # LINE:module
