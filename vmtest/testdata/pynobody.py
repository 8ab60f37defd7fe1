# A CUDA job as a container runs one: a user of its own (nobody), no
# terminal, traced by a cudatrace with only the capabilities the agent
# ships with (vmtest/privilege_test.go). argv[1] is the stand-in, argv[2] a
# module of 200 functions that each allocate once (sites.py, written by
# the test), argv[3] "hold" or "exit".
#
# It prints "ready" and waits for a line; then it loads the stand-in and,
# a first burst, calls each of the 200 functions once: 200 call sites new
# to the process, one right after another. (Loaded after the line, the
# runtime's device is known to a tracer that attached before: it is
# chosen under its eyes.) With "hold" it prints "held" and keeps its memory
# until its stdin ends; with "exit" it leaves at once with os._exit, its
# code objects gone with it before any reader could look at them.
import ctypes
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location("sites", sys.argv[2])
sites = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sites)
print("ready", flush=True)
sys.stdin.readline()
lib = ctypes.CDLL(sys.argv[1])
for i in range(200):
    if getattr(sites, "site%d" % i)(lib) != 0:  # LINE:burst
        sys.exit(3)
if sys.argv[3] == "exit":
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
