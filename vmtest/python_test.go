package vmtest

import (
	"debug/elf"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/tracefile"
)

// pyLine finds the line of testdata/file marked "# LINE:tag".
func pyLine(t *testing.T, file, tag string) int {
	t.Helper()
	return lineEnding(t, file, "# LINE:"+tag)
}

// TestPythonFrames: CPython 3.10 to 3.13 (pyenv's builds) calling nested
// Python functions that allocate through ctypes. The stack of that
// allocation shows each Python frame as file:line:function, exact and in
// order, in place of the interpreter loop's native frames (none of
// _PyEval_EvalFrameDefault is left), between ctypes' call and Py_RunMain.
// An allocation from a thread the interpreter never ran says it had no
// Python frames instead of showing any.
func TestPythonFrames(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	threads := filepath.Join(t.TempDir(), "pythread.so")
	if err := gcc("-shared", "-fPIC", "-O2", "-Wall", "-o", threads, filepath.Join("testdata", "pythread.c"), fakeLib); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			python := pyenvPython(t, v)
			checkPythonFrames(t, v, python, nil, script, threads, "_ctypes_callproc")
		})
	}
}

// TestPythonFramesWithoutDWARF: the same on CPython 3.10 to 3.12 builds
// without DWARF, as distributions ship them: pyenv's, run on a copy of
// their libpython stripped of its debug information (LD_LIBRARY_PATH
// takes precedence over the executable's RUNPATH), and Debian 12's own
// python3.11 (.ci/run installs it). The recorder takes their structure
// offsets from its built-in tables.
func TestPythonFramesWithoutDWARF(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	threads := filepath.Join(t.TempDir(), "pythread.so")
	if err := gcc("-shared", "-fPIC", "-O2", "-Wall", "-o", threads, filepath.Join("testdata", "pythread.c"), fakeLib); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"3.10", "3.11", "3.12"} {
		t.Run(v, func(t *testing.T) {
			python := pyenvPython(t, v)
			libs, _ := filepath.Glob(filepath.Join(filepath.Dir(filepath.Dir(python)), "lib", "libpython"+v+".so.1.0"))
			if len(libs) == 0 {
				skipOrFail(t, "%s has no libpython%s.so.1.0 beside it", python, v)
			}
			dir := t.TempDir()
			stripped := filepath.Join(dir, filepath.Base(libs[0]))
			if out, err := exec.Command("strip", "--strip-debug", "-o", stripped, libs[0]).CombinedOutput(); err != nil {
				t.Fatalf("strip: %v: %s", err, out)
			}
			f, err := elf.Open(stripped)
			if err != nil {
				t.Fatal(err)
			}
			for _, sec := range f.Sections {
				if strings.HasPrefix(sec.Name, ".debug_") || strings.HasPrefix(sec.Name, ".zdebug_") {
					t.Fatalf("%s still has %s", stripped, sec.Name)
				}
			}
			f.Close()
			// The process must load the copy, not the original.
			out, err := exec.Command("env", "LD_LIBRARY_PATH="+dir, "ldd", python).CombinedOutput()
			if err != nil || !strings.Contains(string(out), stripped) {
				t.Fatalf("ldd %s with the copy first: %v\n%s", python, err, out)
			}
			checkPythonFrames(t, v, python, []string{"LD_LIBRARY_PATH=" + dir}, script, threads, "_ctypes_callproc")
		})
	}
	// Debian 12's own interpreter: 3.11.2, static, without DWARF.
	t.Run("debian-3.11", func(t *testing.T) {
		const python = "/usr/bin/python3.11"
		f, err := elf.Open(python)
		if err != nil {
			skipOrFail(t, "Debian's python3.11: %v", err)
			return
		}
		defer f.Close()
		if f.Section(".debug_info") != nil {
			t.Fatalf("%s has DWARF: it would not test the tables", python)
		}
		// Its _ctypes module is stripped: its _ctypes_callproc has no
		// name; libffi's ffi_call, which it calls, has.
		checkPythonFrames(t, "3.11", python, nil, script, threads, "ffi_call")
	})
}

// TestPythonFramesShapes: CPython 3.10 to 3.13 (pyenv's) and Debian sid's
// 3.14 and 3.15 (in a root of their own) allocating from frames the BPF
// walk finds in different places (testdata/pyshapes.py): a generator's
// frame and a coroutine's, resumed from C; ten frames deep of 3 KiB frames, which span
// pages and more than one data stack chunk; a call back from C (sorted's
// key); a second Python thread, twice (the second time from what the walk
// keeps of the thread). Each allocation's Python frames are exact, in
// order.
func TestPythonFramesShapes(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13", "sid-3.14", "sid-3.15"} {
		t.Run(v, func(t *testing.T) {
			py := newPyRunner(t, v)
			script := py.script(t, "pyshapes.py")
			// A session's first process in a root never seen is read
			// only once the reader gets to it: on a loaded machine (CI's
			// kernel guests beside it) it may have allocated before, its
			// frames absent and said by record. Such a run shows no
			// shapes: it is run again, up to three in all.
			for attempt := 1; ; attempt++ {
				truth, rep, stderr := recordArgvStderr(t, nil, py.argv(script, fakeLib)...)
				if m := noInterpRE.FindStringSubmatch(stderr); m != nil && attempt < 3 {
					t.Logf("run %d: record said %q: the reader was behind; again", attempt, m[0])
					continue
				}
				checkPythonShapes(t, py.minor(), script, rep, truth)
				break
			}
		})
	}
}

// checkPythonShapes checks the report of testdata/pyshapes.py run on
// CPython v.
func checkPythonShapes(t *testing.T, v, script string, rep *report, truth *procTruth) {
	t.Helper()
	at := func(fn, tag string) string {
		return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyshapes.py", tag), fn)
	}
	bySize := map[uint64]reportStack{}
	for _, s := range rep.Stacks {
		if s.PID == truth.PID {
			bySize[s.AllocBytes] = s
		}
	}
	want := map[uint64][]string{
		1 << 20:  {at("alloc", "alloc"), at("<module>", "warmup")},
		7 << 20:  {at("alloc", "alloc"), at("gen", "gen"), at("<module>", "main-gen")},
		9 << 20:  {at("alloc", "alloc"), at("big", "big0")},
		11 << 20: {at("alloc", "alloc"), at("<module>", "main-sorted")},
		17 << 20: {at("alloc", "alloc"), at("coro", "coro"), at("run_coro", "run-coro"), at("<module>", "main-coro")},
		13 << 20: {at("alloc", "alloc"), at("worker", "worker1")},
		15 << 20: {at("alloc", "alloc"), at("worker", "worker2")},
	}
	for range 7 {
		want[9<<20] = append(want[9<<20], at("big", "bigk"))
	}
	want[9<<20] = append(want[9<<20], at("<module>", "main-big"))
	// The thread's frames below worker are threading.py's.
	thread := []string{"run", "_bootstrap_inner", "_bootstrap"}
	if v != "3.10" { // 3.10's code objects have no qualified name
		for i, fn := range thread {
			thread[i] = "Thread." + fn
		}
	}
	if len(bySize) != len(want) {
		t.Fatalf("%d stacks for pid %d, want %d: %+v", len(bySize), truth.PID, len(want), rep.Stacks)
	}
	for size, w := range want {
		s, ok := bySize[size]
		if !ok {
			t.Errorf("no stack of the %d MiB allocation", size>>20)
			continue
		}
		py, _, _, _ := pythonFrames(t, s)
		if size == 13<<20 || size == 15<<20 {
			var below []string
			for _, f := range s.Frames {
				if f.Module == "[python]" && strings.HasSuffix(f.File, "/threading.py") {
					below = append(below, f.Function)
				}
			}
			if len(py) != len(w)+len(thread) || strings.Join(below, " ") != strings.Join(thread, " ") {
				t.Errorf("%d MiB: Python frames:\n%s\nwant:\n%s\nthen threading.py's %q", size>>20,
					strings.Join(py, "\n"), strings.Join(w, "\n"), thread)
				continue
			}
			py = py[:len(w)]
		}
		if strings.Join(py, "\n") != strings.Join(w, "\n") {
			t.Errorf("%d MiB: Python frames:\n%s\nwant:\n%s", size>>20, strings.Join(py, "\n"), strings.Join(w, "\n"))
		}
	}
}

// checkPythonFrames records python (CPython v) running pyframes.py, with
// env added to the environment, and checks the Python frames of its
// allocations: they stand between the native frame call (ctypes' call
// into the stand-in) and Py_RunMain.
func checkPythonFrames(t *testing.T, v, python string, env []string, script, threads, call string) {
	t.Helper()
	truth, rep := recordPython(t, python, env, script, fakeLib, threads)
	checkPythonReport(t, v, script, call, rep, truth)
}

// recordPython records python running args (a script and its arguments),
// with env added to the environment: the truth of its one process and the
// report.
func recordPython(t *testing.T, python string, env []string, args ...string) (*procTruth, *report) {
	t.Helper()
	return recordArgv(t, env, append([]string{python}, args...)...)
}

// recordArgv records the command argv (one Python process), with env
// added to the environment: the truth of its one process and the report.
func recordArgv(t *testing.T, env []string, argv ...string) (*procTruth, *report) {
	t.Helper()
	truth, rep, _ := recordArgvStderr(t, env, argv...)
	return truth, rep
}

// recordArgvStderr is recordArgv, with what record said on stderr.
func recordArgvStderr(t *testing.T, env []string, argv ...string) (*procTruth, *report, string) {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "py.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, env...)},
		append([]string{"--lib", fakeLib, "-o", trace, "--"}, argv...)...)
	rec.finish(t, 60*time.Second)
	return onlyTruth(t, log, ""), runReport(t, ctx, trace), rec.stderr.String()
}

// checkPythonReport checks the report of testdata/pyframes.py run on
// CPython v: the Python frames of its three allocations, exact, where the
// interpreter loop stood among the native frames, and the thread without
// Python frames.
func checkPythonReport(t *testing.T, v, script, call string, rep *report, truth *procTruth) {
	t.Helper()
	// 3.10's code objects have no qualified name.
	model := "Model."
	if v == "3.10" {
		model = ""
	}
	want := []string{
		fmt.Sprintf("%s:%d:%sleaf", script, pyLine(t, "pyframes.py", "leaf"), model),
		fmt.Sprintf("%s:%d:%smiddle", script, pyLine(t, "pyframes.py", "middle"), model),
		fmt.Sprintf("%s:%d:outer", script, pyLine(t, "pyframes.py", "outer")),
		fmt.Sprintf("%s:%d:<module>", script, pyLine(t, "pyframes.py", "main")),
	}
	bySize := map[uint64]reportStack{}
	for _, s := range rep.Stacks {
		if s.PID == truth.PID {
			bySize[s.AllocBytes] = s
		}
	}
	if len(bySize) != 3 {
		t.Fatalf("%d stacks for pid %d, want 3 (warm-up, nested, thread): %+v", len(bySize), truth.PID, rep.Stacks)
	}
	nested, ok := bySize[3<<20]
	if !ok {
		t.Fatalf("no stack of the 3 MiB allocation: %+v", bySize)
	}
	py, native, first, last := pythonFrames(t, nested)
	if strings.Join(py, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Python frames:\n%s\nwant:\n%s", strings.Join(py, "\n"), strings.Join(want, "\n"))
	}
	// The process's first allocation, made right as it started: its
	// frames too, exact (BPF knew the interpreter's layout by its file).
	warm, ok := bySize[1<<20]
	if !ok {
		t.Fatalf("no stack of the 1 MiB warm-up: %+v", bySize)
	}
	wantWarm := []string{
		fmt.Sprintf("%s:%d:warmup", script, pyLine(t, "pyframes.py", "warmup")),
		fmt.Sprintf("%s:%d:<module>", script, pyLine(t, "pyframes.py", "main")),
	}
	if py, _, _, _ := pythonFrames(t, warm); strings.Join(py, "\n") != strings.Join(wantWarm, "\n") {
		t.Errorf("first allocation's Python frames:\n%s\nwant:\n%s", strings.Join(py, "\n"), strings.Join(wantWarm, "\n"))
	}
	// Where the interpreter loop stood: below ctypes' call, above main.
	at := func(fn string) int {
		for i, f := range nested.Frames {
			if f.Function == fn {
				return i
			}
		}
		return -1
	}
	if c, m := at(call), at("Py_RunMain"); c < 0 || m < 0 || c > first || last > m {
		t.Errorf("Python frames at #%d-#%d; %s #%d, Py_RunMain #%d: %q", first, last, call, c, m, native)
	}
	// The thread without Python: native frames, then the marker.
	thr, ok := bySize[5<<20]
	if !ok {
		t.Fatalf("no stack of the thread's 5 MiB allocation: %+v", bySize)
	}
	n := len(thr.Frames)
	if n < 2 || thr.Frames[0].Function != "run" || thr.Frames[n-1].Function != "[no Python frames on this thread]" {
		t.Fatalf("thread stack %+v: want run first and the no-Python marker last", thr.Frames)
	}
	for _, f := range thr.Frames[:n-1] {
		if f.Module == "[python]" {
			t.Errorf("thread stack has a Python frame %+v", f)
		}
	}
}

// pythonFrames are stack s's Python frames as file:line:function, the
// names of its native ones, and where the Python frames start and end.
// No native frame may be the interpreter loop: its Python frames replace
// it.
func pythonFrames(t *testing.T, s reportStack) (py, native []string, first, last int) {
	t.Helper()
	first, last = -1, -1
	for i, f := range s.Frames {
		if f.Module == "[python]" {
			py = append(py, fmt.Sprintf("%s:%d:%s", f.File, f.Line, f.Function))
			if first < 0 {
				first = i
			}
			last = i
			continue
		}
		native = append(native, f.Function)
		if f.Function == "_PyEval_EvalFrameDefault" {
			t.Errorf("frame #%d is still the interpreter loop: its Python frames were not merged in", i)
		}
	}
	return py, native, first, last
}

// TestPythonFramesAttach: a CPython 3.10 to 3.15 process traced with
// --pid gets the Python frames of its first allocation: the recorder
// looks for the interpreter when tracing starts, before any record.
// Debian sid's 3.14 and 3.15 run in a root of their own: the interpreter
// is read through the process's root, not the tracer's.
func TestPythonFramesAttach(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13", "sid-3.14", "sid-3.15"} {
		t.Run(v, func(t *testing.T) {
			py := newPyRunner(t, v)
			script := py.script(t, "pyattach.py")
			ctx := testContext(t)
			dir := t.TempDir()
			log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "attach.trace")
			argv := py.argv(script, fakeLib)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Env = fakeEnv(log)
			j := startCmdJob(t, "pyattach.py", cmd) // it has said "ready"
			pid := j.pid
			rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--pid", strconv.Itoa(pid), "-o", trace)
			rec.waitAttached(t, 30*time.Second)
			if _, err := io.WriteString(j.in, "go\n"); err != nil {
				t.Fatal(err)
			}
			if err := j.cmd.Wait(); err != nil {
				t.Fatalf("pyattach.py: %v", err) // its stderr is logged on the way out
			}
			rec.finish(t, 20*time.Second) // ends by itself once its target has exited
			if truth := onlyTruth(t, log, ""); truth.PID != pid {
				t.Fatalf("ground truth for pid %d, want %d", truth.PID, pid)
			}
			rep := runReport(t, ctx, trace)
			var stacks []reportStack
			for _, s := range rep.Stacks {
				if s.PID == pid {
					stacks = append(stacks, s)
				}
			}
			if len(stacks) != 1 || stacks[0].AllocBytes != 7<<20 || stacks[0].Allocs != 1 {
				t.Fatalf("stacks of pid %d: %+v, want the one 7 MiB allocation", pid, stacks)
			}
			want := []string{
				fmt.Sprintf("%s:%d:leaf", script, pyLine(t, "pyattach.py", "leaf")),
				fmt.Sprintf("%s:%d:outer", script, pyLine(t, "pyattach.py", "outer")),
				fmt.Sprintf("%s:%d:<module>", script, pyLine(t, "pyattach.py", "main")),
			}
			if py, _, _, _ := pythonFrames(t, stacks[0]); strings.Join(py, "\n") != strings.Join(want, "\n") {
				t.Fatalf("Python frames:\n%s\nwant:\n%s", strings.Join(py, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

// pyenvPython is pyenv's CPython interpreter of version v ("3.12"): the
// image carries 3.8 to 3.13, built with DWARF. Without it a test skips,
// or fails in CI.
func pyenvPython(t *testing.T, v string) string {
	t.Helper()
	return testenv.Python(t, v)
}

// TestPythonCapturedOnce: the frame-pointer walk of a CPython process's
// records reads data as return addresses (the interpreter and libffi keep
// no frame pointers), outside every mapping, which is also how a library
// mapped since the process's capture shows. The recorder reads the
// mappings again, at most every 200 ms, and captures the process anew
// only when the files mapped changed: a 2-second loop that maps nothing
// is one process frame in the trace, where it was one per 200 ms (each
// finding the interpreter's layout again).
func TestPythonCapturedOnce(t *testing.T) {
	ctx, dir := traceSetup(t)
	python := pyenvPython(t, "3.12")
	script, _ := filepath.Abs(filepath.Join("testdata", "pyrepeat.py"))
	trace := filepath.Join(dir, "repeat.trace")
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "-o", trace, "--", python, script, fakeLib, "2")
	rec.finish(t, 60*time.Second)
	if !strings.Contains(rec.stdout.String(), "pairs=") {
		t.Fatalf("pyrepeat said %q", rec.stdout.String())
	}
	frames, events := map[uint32]int{}, 0
	eachFrame(t, trace, func(fr *tracefile.Record) {
		switch fr.Type {
		case tracefile.TypeProcess:
			frames[fr.Process.PID]++
		case tracefile.TypeEvent:
			events++
		}
	})
	if len(frames) != 1 || events < 1000 {
		t.Fatalf("process frames %v, %d events; want one process of at least 1000 events", frames, events)
	}
	for pid, n := range frames {
		if n != 1 {
			t.Errorf("pid %d captured %d times over %d events; want once: it mapped nothing new", pid, n, events)
		}
	}
}

// TestPythonRenewedCode: functions made, called and let go one after
// another, each one's code object likely made at the address of the one
// before (CPython's allocator hands a freed block out again): every
// allocation is named by its own function, file and line, never by the
// one that had its code object's address before (bpf/pycode.h checks a
// code object's identity; record renews the frames at its address).
// pyenv's 3.10 to 3.13, and Debian sid's 3.14 and 3.15 in a root of their
// own (pivot_root), launched and under --all.
func TestPythonRenewedCode(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	for _, v := range []string{"3.10", "3.12", "3.13", "sid-3.13", "sid-3.14", "sid-3.15", "all/sid-3.14", "all/sid-3.15"} {
		t.Run(v, func(t *testing.T) {
			all := strings.HasPrefix(v, "all/")
			py := newPyRunner(t, strings.TrimPrefix(v, "all/"))
			script := py.script(t, "pyrenew.py")
			ctx := testContext(t)
			dir := t.TempDir()
			log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "renew.trace")
			var out string // the script's lines (and, launched, record's summary)
			if all {
				rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "-o", trace, "--all")
				rec.waitAttached(t, 60*time.Second)
				py.warm(t, ctx)
				argv := py.argv(script, fakeLib)
				cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
				cmd.Env = fakeEnv(log)
				b, err := cmd.Output()
				if err != nil {
					t.Fatalf("pyrenew.py: %v\n%s", err, b)
				}
				out = string(b)
				time.Sleep(time.Second) // read: then stopped
				rec.cmd.Process.Signal(syscall.SIGINT)
				rec.finish(t, 60*time.Second)
			} else {
				rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, append([]string{"--lib", fakeLib, "-o", trace, "--"}, py.argv(script, fakeLib)...)...)
				rec.finish(t, 60*time.Second)
				out = rec.stdout.String()
			}
			var addrs []string
			for _, f := range strings.Fields(out) {
				if strings.HasPrefix(f, "0x") {
					addrs = append(addrs, f)
				}
			}
			reused := len(addrs) - len(slices.Compact(slices.Sorted(slices.Values(addrs))))
			if len(addrs) != 40 {
				t.Fatalf("pyrenew.py printed %d addresses, want 40:\n%s", len(addrs), out)
			}
			if reused == 0 {
				t.Fatalf("no code object was made at a freed one's address: the test proves nothing (%v)", addrs)
			}
			t.Logf("CPython %s: %d of 40 code objects made at an address one before had", v, reused)
			truth := onlyTruth(t, log, "")
			rep := runReportArgs(t, ctx, trace, "--top", "100")
			checkProcess(t, rep, truth, 0, py.base())
			bySize := map[uint64][]string{}
			for _, s := range rep.Stacks {
				if s.PID == truth.PID && s.Allocs == 1 {
					bySize[s.AllocBytes] = pyFrameNames(s.Frames)
				}
			}
			for i := range 40 {
				want := []string{fmt.Sprintf("%s:%d:alloc", script, pyLine(t, "pyrenew.py", "alloc")),
					fmt.Sprintf("made%d.py:%d:made_%d", i, i+2, i),
					fmt.Sprintf("%s:%d:<module>", script, pyLine(t, "pyrenew.py", "call"))}
				if got := bySize[uint64(i+1)*4096]; !slices.Equal(got, want) {
					t.Errorf("round %d: Python frames %q, want %q", i, got, want)
				}
			}
		})
	}
}
