#!/usr/bin/env python3
"""cudatrace's real-GPU validation suite.

Runs real workloads (PyTorch, JAX, CuPy) under `cudatrace record`, and
compares what cudatrace saw with each framework's own account of its
memory, read by the workload itself at quiet checkpoints (workloads/):

  torch-native      segments (memory_reserved) and tensors (memory_allocated)
                    at every checkpoint, and the caching allocator's segments
                    (torch.cuda.memory._snapshot()) address for address
  torch-expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
                    (the driver's VMM API)
  torch-async       the same with backend:cudaMallocAsync
  torch-oom         a deliberate out-of-memory: the failed call and its stack
  torch-stacks      the Python line that allocated a known tensor is in its stack
  torch-memviz      cudatrace's memviz export read by PyTorch's own
                    `python -m torch.cuda._memory_viz stats`, beside PyTorch's
  nvml              traced bytes plus the CUDA context's cost (a baseline
                    process) against NVML's figure for the process; and
                    cudatrace's own NVML samples against nvidia-smi's
  overhead          training step time: traced / untraced, and traced /
                    torch.cuda.memory._record_memory_history; and traced
                    without the Python walk, and without the stack window
  jax-platform, jax-bfc, cupy-pool, cupy-nopool
  standin           the same machinery on the test stand-in libcudart
                    (--standin-lib): runs anywhere, GPU or not

A framework that is not installed makes its checks "skip", not fail. The
results go to OUT/results.json and OUT/results.md; the exit status is 1
when a check failed. Standard library only: it runs where PyTorch runs.

  vmtest/gpu/run.sh OUT [--only torch-native,nvml]
"""
import argparse
import datetime
import fnmatch
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS = os.path.join(HERE, "workloads")

ALL = ["standin", "torch-native", "torch-expandable", "torch-async", "torch-oom", "torch-stacks",
       "torch-memviz", "nvml", "overhead", "jax-platform", "jax-bfc", "cupy-pool", "cupy-nopool"]


class Skip(Exception):
    pass


class Suite:
    def __init__(self, args):
        self.cudatrace = os.path.abspath(args.cudatrace)
        self.out = os.path.abspath(args.out)
        self.python = args.python
        self.standin_lib = args.standin_lib
        self.steps = args.steps
        self.timeout = args.timeout
        self.results = []
        self.env = {}
        self.runs = {}  # name -> (trace, truth), reused across checks
        self.read = {}  # what cudatrace read of a trace, by the trace's identity and the question
        os.makedirs(self.out, exist_ok=True)

    # --- running things -------------------------------------------------

    def has(self, module):
        r = subprocess.run([self.python, "-c", "import " + module], capture_output=True, text=True)
        return r.returncode == 0

    def need(self, module):
        if not self.has(module):
            raise Skip("%s is not installed for %s" % (module, self.python))

    def workload_cmd(self, script, truth, *args):
        return [self.python, os.path.join(WORKLOADS, script), "--truth", truth, *args]

    def traced(self, name, script, *args, env=None, record=()):
        """Runs a workload under cudatrace record; returns (trace, truth doc)."""
        if name in self.runs:
            return self.runs[name]
        trace = os.path.join(self.out, name + ".trace")
        truth = os.path.join(self.out, name + ".truth.json")
        cmd = [self.cudatrace, "record", "-o", trace, *record, "--"] + self.workload_cmd(script, truth, *args)
        self.run(name, cmd, env)
        with open(truth) as f:
            doc = json.load(f)
        self.runs[name] = (trace, doc)
        return self.runs[name]

    def untraced(self, name, script, *args, env=None):
        truth = os.path.join(self.out, name + ".truth.json")
        self.run(name, self.workload_cmd(script, truth, *args), env)
        with open(truth) as f:
            return json.load(f)

    def run(self, name, cmd, env=None):
        full = dict(os.environ)
        full["PYTHONPATH"] = WORKLOADS + os.pathsep + full.get("PYTHONPATH", "")
        full.update(env or {})
        log = os.path.join(self.out, name + ".log")
        t0 = time.time()
        with open(log, "w") as f:
            f.write("$ %s\n" % " ".join(cmd))
            f.flush()
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=full, timeout=self.timeout)
        print("  ran %s in %.1fs (log %s)" % (name, time.time() - t0, log), flush=True)
        if r.returncode != 0:
            with open(log) as f:
                tail = f.read()[-3000:]
            raise RuntimeError("%s exited %d:\n%s" % (name, r.returncode, tail))

    def ct(self, *args):
        r = subprocess.run([self.cudatrace, *args], capture_output=True)
        if r.returncode != 0:
            raise RuntimeError("cudatrace %s: %s" % (" ".join(args), r.stderr.decode(errors="replace")))
        return r.stdout

    def once(self, trace, question, fn):
        """fn() the first time question is asked of this trace, as it is
        on disk: several checks read one run (torch-native's trace is read
        by three), and a read of a large trace takes seconds of a lease.
        The answer is shared: callers only read it."""
        st = os.stat(trace)
        key = (trace, st.st_mtime_ns, st.st_size) + question
        if key not in self.read:
            self.read[key] = fn()
        return self.read[key]

    def report(self, trace):
        return self.once(trace, ("report",), lambda: json.loads(self.ct("report", trace, "--json")))

    def memviz_at(self, trace, pid, wall_ns, rep):
        """The memviz snapshot of pid at a checkpoint's wall-clock time:
        its segments only (no trace entries), with their frames' files, by
        which owner_of tells PyTorch's segments from the libraries'."""
        def export():
            offset = wall_ns - rfc3339_ns(rep["trace"]["start"])
            path = os.path.join(self.out, "at.pickle")
            self.ct("export", trace, "--format", "memviz", "--pid", str(pid), "--at", "%dns" % max(offset, 0),
                    "--memviz-entries", "0", "-o", path)
            with open(path, "rb") as f:
                return pickle.load(f)
        return self.once(trace, ("memviz", pid, wall_ns), export)

    # --- bookkeeping -----------------------------------------------------

    def check(self, name, fn):
        print("== %s" % name, flush=True)
        t0 = time.time()
        res = {"check": name}
        try:
            figures = fn() or {}
            res.update(figures)
            res["status"] = "fail" if res.get("problems") else "pass"
        except Skip as e:
            res.update(status="skip", reason=str(e))
        except Exception as e:  # a check that cannot run is a failure, with why
            res.update(status="error", reason="%s: %s" % (type(e).__name__, e))
        res["seconds"] = round(time.time() - t0, 1)
        print("   %s %s" % (res["status"], res.get("reason") or "; ".join(res.get("problems", []))[:2000]),
              flush=True)
        self.results.append(res)
        self.write()

    def write(self):
        # After every check, so a run cut short (a device's time limit)
        # still leaves the results of the checks it finished.
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump({"environment": self.env, "results": self.results}, f, indent=1)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(markdown(self.env, self.results))

    # --- comparisons -----------------------------------------------------

    def compare_checkpoints(self, trace, doc, fields, exact=True, owner=None):
        """fields: truth key -> what to sum in the memviz snapshot at that
        checkpoint ("total_size": segments, "allocated_size": tensor
        blocks, "requested_size": the bytes asked for). owner: only the
        segments of that owner count (PyTorch's memory_reserved counts its
        caching allocator's, not cuBLAS's or cuDNN's own cudaMalloc); the
        others' bytes are in each row. Returns the rows and the problems."""
        rep = self.report(trace)
        rows, problems = [], []
        for cp in doc["checkpoints"]:
            snap = self.memviz_at(trace, doc["pid"], cp["wall_ns"], rep)
            row = {"label": cp["label"]}
            segs = snap["segments"]
            if owner:
                segs, others = [], {}
                for s in snap["segments"]:
                    o = owner_of(s["frames"])
                    if o == owner:
                        segs.append(s)
                    else:
                        others[o] = others.get(o, 0) + s["total_size"]
                row["other_owners"] = others
            for key, what in fields.items():
                want = cp.get(key)
                got = sum(s[what] for s in segs)
                row[key] = {"framework": want, "cudatrace": got}
                if want is not None and got != want and exact:
                    problems.append("%s %s: cudatrace %d, framework %d (%+d)" % (cp["label"], key, got, want, got - want))
            rows.append(row)
        return rows, problems

    # --- the checks ------------------------------------------------------

    def standin(self):
        if not self.standin_lib:
            raise Skip("no --standin-lib")
        trace, doc = self.traced("standin", "standin.py", "--lib", self.standin_lib,
                                 record=["--lib", self.standin_lib])
        rows, problems = self.compare_checkpoints(trace, doc, {"reserved": "total_size"})
        problems += self.compare_segments(trace, doc)
        return {"checkpoints": rows, "problems": problems}

    def compare_segments(self, trace, doc, by_address=True, owner=None):
        rep = self.report(trace)
        cp = [c for c in doc["checkpoints"] if c["label"] == "snapshot"][0]
        snap = self.memviz_at(trace, doc["pid"], cp["wall_ns"], rep)
        got = sorted((s["address"], s["total_size"]) for s in snap["segments"]
                     if not owner or owner_of(s["frames"]) == owner)
        want = sorted((s["address"], s["total_size"]) for s in doc["segments"])
        if not by_address:
            gs, ws = sum(s for _, s in got), sum(s for _, s in want)
            return [] if gs == ws else ["segments: cudatrace %d bytes in %d, framework %d in %d" % (gs, len(got), ws, len(want))]
        if got == want:
            return []
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        return ["segments differ: %d framework segments not traced %s, %d traced not in the framework's %s" %
                (len(missing), fmt_segs(missing), len(extra), fmt_segs(extra))]

    def torch_run(self, name, conf=None, *extra):
        self.need("torch")
        env = {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}
        return self.traced(name, "torch_train.py", "--steps", str(self.steps), *extra, env=env)

    def torch_native(self):
        trace, doc = self.torch_run("torch-native", None, "--snapshot", os.path.join(self.out, "torch-native.torch.pickle"))
        rows, problems = self.compare_checkpoints(trace, doc, {"reserved": "total_size", "allocated": "allocated_size", "requested": "requested_size"}, owner="pytorch")
        problems += self.compare_segments(trace, doc, owner="pytorch")
        return {"checkpoints": rows, "problems": problems}

    def torch_expandable(self):
        trace, doc = self.torch_run("torch-expandable", "expandable_segments:True")
        rows, problems = self.compare_checkpoints(trace, doc, {"reserved": "total_size", "allocated": "allocated_size", "requested": "requested_size"}, owner="pytorch")
        # The memviz export draws VMM memory where it is mapped, one
        # expandable segment per run of mappings, as PyTorch does: its
        # segments are PyTorch's, address for address.
        problems += self.compare_segments(trace, doc, owner="pytorch")
        rep = self.report(trace)
        p = proc_of(rep, doc["pid"])
        last = doc["checkpoints"][-1]
        if p["vmm_mapped_bytes"] != last["reserved"]:
            problems.append("vmm_mapped_bytes %d at the end, memory_reserved %d" % (p["vmm_mapped_bytes"], last["reserved"]))
        return {"checkpoints": rows, "vmm_mapped_bytes": p["vmm_mapped_bytes"], "vmm_maps": p["vmm_maps"],
                "problems": problems}

    def torch_async(self):
        trace, doc = self.torch_run("torch-async", "backend:cudaMallocAsync")
        # Each tensor is one cudaMallocAsync: segments are tensors.
        rows, problems = self.compare_checkpoints(trace, doc, {"allocated": "total_size"}, owner="pytorch")
        return {"checkpoints": rows, "problems": problems}

    def torch_oom(self):
        trace, doc = self.torch_run("torch-oom", None, "--oom", "--steps", "20")
        if not doc.get("oom"):
            return {"problems": ["the workload's 64 TiB allocation did not fail"]}
        rep = self.report(trace)
        size = doc["oom"]["size"]
        fails = [f for f in rep["failures"] if f.get("size", 0) >= size]
        problems = []
        if not fails:
            problems.append("no failed call of %d bytes among %d failures" % (size, len(rep["failures"])))
        for f in fails:
            if "MemoryAllocation" not in f.get("error", "") and "OUT_OF_MEMORY" not in f.get("error", ""):
                problems.append("failure %s: error %s" % (f.get("api"), f.get("error")))
            if not f.get("frames"):
                problems.append("failure %s has no stack" % f.get("api"))
        python_line = any(on_line(fr, doc["file"], doc["oom"]["line"]) for f in fails for fr in f.get("frames") or [])
        return {"failures": [{k: f.get(k) for k in ("api", "error", "size", "device")} for f in fails],
                "python_line_in_stack": python_line, "problems": problems}

    def torch_stacks(self):
        trace, doc = self.torch_run("torch-native", None)
        rep = self.report(trace)
        hits = [s for s in rep["stacks"] if any(on_line(fr, doc["file"], doc["big_line"]) for fr in s["frames"])]
        problems = [] if hits else ["no stack holds %s:%d (torch.empty of 64 MiB)" % (doc["file"], doc["big_line"])]
        deepest = max((len(s["frames"]) for s in rep["stacks"]), default=0)
        return {"stacks": len(rep["stacks"]), "deepest": deepest, "stacks_with_line": len(hits), "problems": problems}

    def torch_memviz(self):
        """PyTorch's own `_memory_viz stats` reads cudatrace's export. The
        whole file (cuBLAS's and cuDNN's segments too) must read and hold
        PyTorch's allocated bytes; its PyTorch segments alone must print
        what PyTorch's own snapshot prints, line for line."""
        trace, doc = self.torch_run("torch-native", None, "--snapshot", os.path.join(self.out, "torch-native.torch.pickle"))
        theirs = os.path.join(self.out, "torch-native.torch.pickle")
        ours = os.path.join(self.out, "torch-native.cudatrace.pickle")
        ours_pytorch = os.path.join(self.out, "torch-native.cudatrace-pytorch.pickle")
        rep = self.report(trace)
        cp = [c for c in doc["checkpoints"] if c["label"] == "snapshot"][0]
        offset = cp["wall_ns"] - rfc3339_ns(rep["trace"]["start"])
        self.ct("export", trace, "--format", "memviz", "--pid", str(doc["pid"]), "--at", "%dns" % offset, "-o", ours)
        with open(ours, "rb") as f:
            snap = pickle.load(f)
        snap["segments"] = [s for s in snap["segments"] if owner_of(s["frames"]) == "pytorch"]
        with open(ours_pytorch, "wb") as f:
            pickle.dump(snap, f)
        out = {}
        for who, path in (("pytorch", theirs), ("cudatrace", ours), ("cudatrace_pytorch", ours_pytorch)):
            r = subprocess.run([self.python, "-m", "torch.cuda._memory_viz", "stats", path], capture_output=True, text=True)
            out[who] = {"rc": r.returncode, "stdout": r.stdout[-4000:], "stderr": r.stderr[-2000:]}
        problems = []
        for who in out:
            if out[who]["rc"] != 0:
                problems.append("torch.cuda._memory_viz stats failed on %s's file: %s" % (who, out[who]["stderr"][-500:]))
            else:
                out[who]["totals"] = totals(out[who]["stdout"])
                missing = [k for k in STATS_KEYS if k not in out[who]["totals"]]
                if missing:  # a changed format must not pass as {} == {}
                    problems.append("%s's stats printed no %s: %r" % (who, ", ".join(missing), out[who]["stdout"][-500:]))
        if not problems:
            if out["cudatrace_pytorch"]["totals"] != out["pytorch"]["totals"]:
                problems.append("stats totals of PyTorch's segments differ: cudatrace %s, pytorch %s" % (
                    out["cudatrace_pytorch"]["totals"], out["pytorch"]["totals"]))
            if out["cudatrace"]["totals"]["total_allocated"] != out["pytorch"]["totals"]["total_allocated"]:
                problems.append("total_allocated of the whole export %s, pytorch %s" % (
                    out["cudatrace"]["totals"]["total_allocated"], out["pytorch"]["totals"]["total_allocated"]))
        return {"stats": out, "problems": problems}

    def nvml(self):
        """NVML's figure for a process is what it allocated plus what no
        allocation call accounts for: the CUDA context and the module
        images the driver loads, lazily, as kernels are first used (the
        first H100 run: 92 MiB fewer than a baseline process at the start,
        19 MiB more once cuBLAS and cuDNN kernels ran). So the remainder is
        compared with itself: from the first checkpoint after warm-up on,
        through a 1 GiB tensor and empty_cache(), NVML must move exactly as
        the traced bytes do (within NVML's MiB rounding)."""
        self.need("torch")
        if not shutil.which("nvidia-smi"):
            raise Skip("no nvidia-smi")
        btrace, bdoc = self.traced("nvml-baseline", "nvml_baseline.py")
        trace, doc = self.traced("nvml-train", "torch_train.py", "--steps", str(self.steps), "--nvml")
        base = bdoc["checkpoints"][0]
        if base.get("nvml_used") is None:
            raise Skip("nvidia-smi does not list the baseline process (containers hide PIDs)")
        brep = self.report(btrace)
        base_rest = base["nvml_used"] - proc_of(brep, bdoc["pid"])["live_bytes"]
        rep = self.report(trace)
        rows, problems = [], []
        for cp in doc["checkpoints"]:
            snap = self.memviz_at(trace, doc["pid"], cp["wall_ns"], rep)
            traced = sum(s["total_size"] for s in snap["segments"])
            rest = cp["nvml_used"] - traced
            rows.append({"label": cp["label"], "nvml_used": cp["nvml_used"], "traced": traced, "remainder": rest})
            if rest < 0:
                problems.append("%s: traced %d is more than NVML's %d" % (cp["label"], traced, cp["nvml_used"]))
        steady = [r for r in rows if r["label"] != "start"]
        if len(steady) < 3 or not any(r["label"] == "nvml +1GiB" for r in steady):
            problems.append("the workload's checkpoints after warm-up are missing: %s" % [r["label"] for r in rows])
        else:
            lo, hi = min(r["remainder"] for r in steady), max(r["remainder"] for r in steady)
            if hi - lo > 2 << 20:
                problems.append("after warm-up NVML moved by other than the traced bytes: remainder from %d to %d (%s)" % (
                    lo, hi, ", ".join("%s %+d MiB" % (r["label"], (r["remainder"] - steady[0]["remainder"]) >> 20)
                                      for r in steady)))
        # cudatrace's own NVML sampling (record, through go-nvml) against
        # nvidia-smi's readings in the workload.
        own = proc_of(rep, doc["pid"]).get("nvml") or {}
        smi = max(cp["nvml_used"] for cp in doc["checkpoints"])
        if not own.get("samples"):
            problems.append("cudatrace recorded no NVML sample of the process: %s" % (rep.get("nvml") or {}).get("error"))
        elif abs(own["max_used_bytes"] - smi) > 64 << 20:
            problems.append("cudatrace's NVML max %d, nvidia-smi's %d" % (own["max_used_bytes"], smi))
        return {"baseline_remainder": base_rest, "loaded_after_start": rows[1]["remainder"] - rows[0]["remainder"]
                if len(rows) > 1 else None, "checkpoints": rows, "cudatrace_nvml": own, "problems": problems}

    def overhead(self):
        self.need("torch")
        # Besides the default recording, two that each leave one cost out,
        # to tell where a traced step's extra time goes: the Python walk
        # (--no-python-frames) and the stack window (--stack-window 0).
        variants = {"traced": (), "traced-no-python": ("--no-python-frames",),
                    "traced-no-window": ("--stack-window", "0")}
        runs = {}
        for rnd in range(3):  # interleaved, medians: the machine drifts
            runs.setdefault("untraced", []).append(
                self.untraced("overhead-untraced-%d" % rnd, "torch_train.py", "--steps", str(self.steps))["step_ms_median"])
            runs.setdefault("history", []).append(
                self.untraced("overhead-history-%d" % rnd, "torch_train.py", "--steps", str(self.steps), "--history")["step_ms_median"])
            for name, flags in variants.items():
                runs.setdefault(name, []).append(self.traced(
                    "overhead-%s-%d" % (name, rnd), "torch_train.py", "--steps", str(self.steps),
                    record=flags)[1]["step_ms_median"])
        med = {k: statistics.median(v) for k, v in runs.items()}
        return {"step_ms": runs, "median_step_ms": med, "traced_over_untraced": med["traced"] / med["untraced"],
                "traced_over_history": med["traced"] / med["history"],
                "history_over_untraced": med["history"] / med["untraced"],
                "no_python_over_untraced": med["traced-no-python"] / med["untraced"],
                "no_window_over_untraced": med["traced-no-window"] / med["untraced"]}

    def jax(self, allocator):
        self.need("jax")
        env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        if allocator == "platform":
            env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
        trace, doc = self.traced("jax-" + allocator, "jax_work.py", env=env)
        rep = self.report(trace)
        rows, problems = [], []
        for cp in doc["checkpoints"]:
            snap = self.memviz_at(trace, doc["pid"], cp["wall_ns"], rep)
            traced = sum(s["total_size"] for s in snap["segments"])
            st = cp.get("stats") or {}
            want = cp["arrays"] if allocator == "platform" else st.get("pool_bytes", st.get("bytes_reserved"))
            rows.append({"label": cp["label"], "traced": traced, "framework": want, "arrays": cp["arrays"], "stats": st})
            if want is None:
                problems.append("%s: memory_stats has no pool_bytes or bytes_reserved: %s" % (cp["label"], sorted(st)))
            elif traced < want:
                problems.append("%s: traced %d < framework %d (%+d)" % (cp["label"], traced, want, traced - want))
        return {"checkpoints": rows, "problems": problems}

    def cupy(self, pool):
        self.need("cupy")
        trace, doc = self.traced("cupy-" + pool, "cupy_work.py", "--pool", "default" if pool == "pool" else "none")
        rows, problems = self.compare_checkpoints(trace, doc, {"reserved": "total_size"})
        return {"checkpoints": rows, "problems": problems}


def rfc3339_ns(s):
    """'2026-11-23T05:55:59.864908676Z' -> Unix ns, every digit kept."""
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", s)
    if not m:
        raise ValueError("not an RFC 3339 time: %r" % s)
    base = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")
    tz = datetime.timezone.utc
    if m.group(3) != "Z":
        sign = 1 if m.group(3)[0] == "+" else -1
        h, mi = int(m.group(3)[1:3]), int(m.group(3)[4:6])
        tz = datetime.timezone(sign * datetime.timedelta(hours=h, minutes=mi))
    secs = int(base.replace(tzinfo=tz).timestamp())
    frac = (m.group(2) or "").ljust(9, "0")[:9]
    return secs * 10**9 + int(frac)


# The components whose own allocations a framework's figures leave out, by
# the file of the innermost frame that names one: the rules of cudatrace's
# owner package (owner.Rules), those that occur on a PyTorch machine.
OWNERS = (("pytorch", ("libc10_cuda.so",)), ("nccl", ("libnccl.so*",)), ("cublas", ("libcublas*.so*",)),
          ("cudnn", ("libcudnn*.so*",)))


def owner_of(frames):
    for f in frames or []:  # innermost first, as PyTorch's own snapshots
        base = os.path.basename(f.get("filename") or "")
        for name, patterns in OWNERS:
            if any(fnmatch.fnmatch(base, p) for p in patterns):
                return name
    return "application"


def proc_of(rep, pid):
    for p in rep["processes"]:
        if p["pid"] == pid:
            return p
    raise RuntimeError("pid %d is not in the report (pids %s)" % (pid, [p["pid"] for p in rep["processes"]]))


def on_line(frame, path, line):
    return frame.get("line") == line and os.path.basename(frame.get("file") or "") == os.path.basename(path)


def fmt_segs(segs):
    return "[" + ", ".join("%#x+%d" % s for s in segs[:5]) + (", ..." if len(segs) > 5 else "") + "]"


STATS_KEYS = ("segments", "total_reserved", "total_allocated", "total_free")


def totals(stats_text):
    """The summary lines of `python -m torch.cuda._memory_viz stats`
    (torch/cuda/_memory_viz.py segsum): "segments: 12", "total_reserved:
    1.2GiB", "total_allocated: 640.0MiB", "total_free: 600.0MiB (3.1%
    internal)", by name, as printed (sizes are rounded to one decimal).
    Only those keys: the per-segment lines and the legend differ in order."""
    out = {}
    for line in stats_text.splitlines():
        m = re.match(r"^(%s): (.+?)\s*$" % "|".join(STATS_KEYS), line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def environment(python):
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "kernel": platform.release()}
    if shutil.which("nvidia-smi"):
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True)
        env["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
    for mod, expr in (("torch", "torch.__version__ + ' cuda ' + str(torch.version.cuda)"),
                      ("jax", "jax.__version__"), ("cupy", "cupy.__version__")):
        r = subprocess.run([python, "-c", "import %s; print(%s)" % (mod, expr)], capture_output=True, text=True)
        env[mod] = r.stdout.strip() if r.returncode == 0 else None
    return env


def markdown(env, results):
    lines = ["# cudatrace on a real GPU", "", "| | |", "|---|---|"]
    for k, v in env.items():
        lines.append("| %s | %s |" % (k, v))
    lines += ["", "| check | status | figures / why |", "|---|---|---|"]
    for r in results:
        why = r.get("reason") or "; ".join(r.get("problems") or [])
        figs = {k: v for k, v in r.items() if k in ("traced_over_untraced", "traced_over_history",
                                                      "history_over_untraced", "baseline_remainder", "loaded_after_start",
                                                      "vmm_mapped_bytes", "python_line_in_stack", "deepest")}
        lines.append("| %s | %s | %s |" % (r["check"], r["status"], (json.dumps(figs) if figs else "") + " " + why.replace("|", "/")))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cudatrace", required=True, help="the cudatrace binary")
    ap.add_argument("--out", required=True, help="directory for traces, logs and results")
    ap.add_argument("--python", default=sys.executable, help="the Python that has the frameworks")
    ap.add_argument("--only", help="comma-separated checks (default: all): " + ", ".join(ALL))
    ap.add_argument("--standin-lib", help="a libcudart for the stand-in check (the test stand-in)")
    ap.add_argument("--steps", type=int, default=300, help="training steps per PyTorch run")
    ap.add_argument("--timeout", type=int, default=540, help="seconds one traced or untraced run may take")
    args = ap.parse_args()
    only = args.only.split(",") if args.only else ALL
    unknown = [c for c in only if c not in ALL]
    if unknown:
        ap.error("unknown checks %s; known: %s" % (unknown, ", ".join(ALL)))
    s = Suite(args)
    fns = {"standin": s.standin, "torch-native": s.torch_native, "torch-expandable": s.torch_expandable,
           "torch-async": s.torch_async, "torch-oom": s.torch_oom, "torch-stacks": s.torch_stacks,
           "torch-memviz": s.torch_memviz, "nvml": s.nvml, "overhead": s.overhead,
           "jax-platform": lambda: s.jax("platform"), "jax-bfc": lambda: s.jax("bfc"),
           "cupy-pool": lambda: s.cupy("pool"), "cupy-nopool": lambda: s.cupy("nopool")}
    s.env = environment(args.python)
    for name in only:
        s.check(name, fns[name])
    s.write()
    bad = [r["check"] for r in s.results if r["status"] in ("fail", "error")]
    print("results: %s/results.md; %d passed, %d skipped, %d failed%s" % (
        s.out, sum(r["status"] == "pass" for r in s.results), sum(r["status"] == "skip" for r in s.results),
        len(bad), (": " + ", ".join(bad)) if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
