# The layout pystack took for this interpreter's build (argv[1], JSON),
# checked against the interpreter itself: this script reads its own memory
# (ctypes) at those offsets, as BPF and pystack read a traced process's,
# and compares what it finds with what the interpreter says of itself
# (threading's ids, id() of its objects, its frames' f_code and f_lineno).
# It prints JSON: what failed (errors), and, for each Python frame the
# walk met, its code object's address, the instruction the walk computed
# (code units, as bpf/python.h computes them), the line CPython gives the
# frame, and the bytes of the code object and of its names and line table,
# for the Go test (TestLayoutProbe) to name the frame with pystack's own
# code and compare. Works from 3.10 on; a wrong offset fails a check here
# or there.
import ctypes
import json
import sys
import threading
import types

L = json.loads(sys.argv[1])
MINOR = sys.version_info[1]
api = ctypes.pythonapi
api.PyThreadState_Get.restype = ctypes.c_void_p
api.PyInterpreterState_Get.restype = ctypes.c_void_p
U64 = ctypes.c_uint64.from_address
U32 = ctypes.c_uint32.from_address
I32 = ctypes.c_int32.from_address
U8 = ctypes.c_uint8.from_address
errors = []
out = {"errors": errors, "frames": []}


def check(ok, what):
    if not ok:
        errors.append(what)


def snapshot():
    # Everything here is read in this function's own body (ctypes' calls
    # are C calls: no Python frame of theirs), so the innermost
    # interpreter frame is this function's.
    ts = api.PyThreadState_Get()
    if L["ts_cframe"] >= 0:
        fp = U64(U64(ts + L["ts_cframe"]).value + L["cf_current"]).value
    else:
        fp = U64(ts + L["ts_frame"]).value
    raw = []
    f = fp
    while f and len(raw) < 64:
        # code object (3.14's stackref tag masked off), instruction, owner, entry flag
        code = U64(f + L["fr_code"]).value & ~7
        if MINOR == 10:
            instr = I32(f + L["fr_instr"]).value
        else:
            instr = U64(f + L["fr_instr"]).value
        owner = U8(f + L["fr_owner"]).value if L["fr_owner"] >= 0 else -1
        entry = U8(f + L["fr_entry"]).value if L["fr_entry"] >= 0 else -1
        raw.append((f, code, instr, owner, entry))
        f = U64(f + L["fr_previous"]).value
    py = []
    pf = sys._getframe()
    while pf is not None:
        py.append(pf)
        pf = pf.f_back
    analyse(ts, raw, py)


def analyse(ts, raw, py):
    check(ts != 0, "no thread state")
    check(U64(ts + L["ts_thread_id"]).value == threading.get_ident(),
          "thread_id at %d is not threading.get_ident()" % L["ts_thread_id"])
    if MINOR >= 11:
        check(U64(ts + L["ts_native_id"]).value == threading.get_native_id(),
              "native_thread_id at %d is not threading.get_native_id()" % L["ts_native_id"])
    # The interpreter list's head leads to a thread list holding ts.
    runtime = ctypes.addressof(ctypes.c_char.in_dll(api, "_PyRuntime"))
    out["runtime"] = runtime
    interp = U64(runtime + L["interp_head"]).value
    t, seen = (U64(interp + L["interp_threads"]).value if interp else 0), 0
    while t and t != ts and seen < 1000:
        t, seen = U64(t + L["ts_next"]).value, seen + 1
    check(t == ts, "the thread list of _PyRuntime's first interpreter does not hold this thread's state")
    if L["interp_code_gen"] > 0:
        # 3.14 on: the thread state's interpreter, and its count of code
        # objects freed, which moves by one as one is freed (compile()
        # may free some of its own).
        interp = api.PyInterpreterState_Get()
        check(U64(ts + L["ts_interp"]).value == interp,
              "interp at %d is not PyInterpreterState_Get()" % L["ts_interp"])
        gen = U64(interp + L["interp_code_gen"])
        g0 = gen.value
        co = compile("x = 1", "<probe>", "exec")
        g1 = gen.value
        del co
        g2 = gen.value
        check(g0 <= g1 and g2 == g1 + 1,
              "_code_object_generation at %d read %d, %d made, %d freed: not one code object freed" % (L["interp_code_gen"], g0, g1, g2))
    out["types"] = {"code": id(types.CodeType), "str": id(str), "bytes": id(bytes)}
    owned_cstack = L["owned_cstack"]
    by_code = {}
    for pf in py:
        by_code.setdefault(id(pf.f_code), pf)
    k = 0  # the next Python frame expected
    for i, (f, code, instr, owner, entry) in enumerate(raw):
        if k < len(py) and code == id(py[k].f_code):
            pf = py[k]
            k += 1
            co = pf.f_code
            if MINOR == 10:
                check(f == id(pf), "frame %d: the thread state's frames are not sys._getframe()'s" % i)
                units = instr  # f_lasti: code units
                # (the innermost frame, this script's, ran on since)
                check(i == 0 or units * 2 == pf.f_lasti, "frame %d (%s): f_lasti %d, CPython says %d" % (i, co.co_name, units * 2, pf.f_lasti))
            else:
                base = code + L["co_code_adaptive"]
                check(base <= instr < base + len(co.co_code),
                      "frame %d (%s): instruction %#x outside co_code_adaptive [%#x, %#x)" % (i, co.co_name, instr, base, base + len(co.co_code)))
                units = (instr - base) >> 1
                check(i == 0 or units * 2 == pf.f_lasti, "frame %d (%s): instruction %d, CPython says %d" % (i, co.co_name, units, pf.f_lasti // 2))
            if owner >= 0:
                check(owner != owned_cstack, "frame %d (%s): owned by the C stack (%d)" % (i, co.co_name, owner))
                gen = co.co_flags & (0x20 | 0x80 | 0x200) != 0  # generator, coroutine, async generator
                check((owner == 1) == gen, "frame %d (%s): owner %d" % (i, co.co_name, owner))
            if entry >= 0:
                want = co.co_name in ("inner_key", "gen", "coro", "probe_thread", "_bootstrap")
                check(bool(entry) == want, "frame %d (%s): is_entry %d" % (i, co.co_name, entry))
            fields = {}
            for name in ("co_filename", "co_name", "co_qualname", "co_linetable"):
                if L[name] >= 0 and hasattr(co, name):
                    fields[name] = U64(code + L[name]).value
                    check(fields[name] == id(getattr(co, name)), "frame %d: %s at %d is not the code's" % (i, name, L[name]))
            check(I32(code + L["co_firstlineno"]).value == co.co_firstlineno, "frame %d: co_firstlineno at %d" % (i, L["co_firstlineno"]))
            regions = [{"at": code, "hex": ctypes.string_at(code, types.CodeType.__basicsize__).hex()}]
            for name, addr in fields.items():
                regions.append({"at": addr, "hex": ctypes.string_at(addr, sys.getsizeof(getattr(co, name))).hex()})
            out["frames"].append({"code": code, "units": units, "file": co.co_filename,
                                  "function": getattr(co, "co_qualname", co.co_name), "line": pf.f_lineno,
                                  "innermost": i == 0, "regions": regions})
        elif MINOR >= 12:
            # a C call's entry frame (shim): none before 3.12
            check(owner == owned_cstack, "frame %d: code %#x is none of the stack's, owner %d" % (i, code, owner))
            check(code not in by_code, "frame %d: a shim frame holds a code object of the stack" % i)
        else:
            check(False, "frame %d: code %#x is none of the stack's (next: %s)" % (i, code, py[k].f_code.co_name if k < len(py) else "none"))
    check(k == len(py), "the walk met %d of the %d Python frames" % (k, len(py)))
    out["shims"] = len(raw) - k


async def coro():
    snapshot()  # the innermost Python frame
    return 1


def gen():
    c = coro()
    try:
        c.send(None)  # a coroutine's frame, entered from C
    except StopIteration:
        pass
    yield 1


def inner_key(x):
    return next(gen())  # a generator's frame, entered from C


class Outer:
    def outer(self):
        # a C call into Python; a method, whose co_qualname is not its co_name
        return sorted([1], key=inner_key)


def probe_thread():
    go.wait()
    try:
        Outer().outer()
    except BaseException as e:
        errors.append("the probe: %r" % e)


# The probe runs in a thread of its own, in the middle of the interpreter's
# list of thread states (each new one goes first): idle's, the probe's, the
# main thread's. Only following next from the list's head finds it.
go, done = threading.Event(), threading.Event()
probe = threading.Thread(target=probe_thread, daemon=True)
probe.start()
idle = threading.Thread(target=done.wait, daemon=True)
idle.start()
go.set()
probe.join()
done.set()
idle.join()
print(json.dumps(out))
