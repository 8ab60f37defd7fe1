# Code objects freed and made anew where they were (vmtest/python_test.go
# TestPythonRenewedCode): each round makes a function of its own (its own
# file name, name and line), allocates through it, and lets it go, code
# object and all, so that the next round's is likely made at the same
# address. The first 20 rounds compile their function's source (3.11 to
# 3.13 then alternate between two addresses: the compiler's own objects
# take the freed place in between); the last 20 copy one function's code
# object under another name (code.replace: the one object made, at the
# freed one's address every round, in every version read). argv[1] is the
# stand-in. Prints each function's code object's address, for the test to
# see the addresses repeat. LINE:tag marks the line a frame must report.
import ctypes
import gc
import sys
import time
import types

lib = ctypes.CDLL(sys.argv[1])


def alloc(n):
    p = ctypes.c_void_p()
    return lib.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))  # LINE:alloc


tmpl = {"alloc": alloc}
exec(compile("def made(n):\n    return alloc(n)\n", "made.py", "exec"), tmpl)
tmpl = tmpl["made"].__code__


def made(i):
    if i < 20:
        ns = {"alloc": alloc}
        src = "\n" * i + f"def made_{i}(n):\n    return alloc(n)\n"
        exec(compile(src, f"made{i}.py", "exec"), ns)
        return ns[f"made_{i}"]
    kw = {"co_name": f"made_{i}", "co_filename": f"made{i}.py", "co_firstlineno": i + 1}
    if sys.version_info >= (3, 11):
        kw["co_qualname"] = f"made_{i}"
    return types.FunctionType(tmpl.replace(**kw), {"alloc": alloc})


# The reader takes a process's exec at once, but it is behind by as long
# as a uprobe's registration on a loaded machine (a root of its own's
# loader attached: 5 to 33 ms seen here): allocations a process in a root
# of its own makes before it has read its interpreter have no Python
# frames, counted (TestPythonFramesReaderBehind). What this test is about
# comes after that moment.
time.sleep(0.3)
for i in range(40):
    f = made(i)
    print(hex(id(f.__code__)), flush=True)
    if f((i + 1) * 4096) != 0:  # LINE:call
        sys.exit(3)
    del f
    gc.collect()  # the function and its globals refer to each other
