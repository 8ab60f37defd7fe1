package vmtest

import (
	"debug/elf"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
			found, _ := filepath.Glob("/root/.pyenv/versions/" + v + ".*/bin/python" + v)
			if len(found) == 0 {
				skipOrFail(t, "no CPython %s under /root/.pyenv/versions", v)
				return
			}
			checkPythonFrames(t, v, found[0], nil, script, threads, "_ctypes_callproc")
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
			found, _ := filepath.Glob("/root/.pyenv/versions/" + v + ".*/bin/python" + v)
			libs, _ := filepath.Glob("/root/.pyenv/versions/" + v + ".*/lib/libpython" + v + ".so.1.0")
			if len(found) == 0 || len(libs) == 0 {
				skipOrFail(t, "no CPython %s with its libpython under /root/.pyenv/versions", v)
				return
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
			out, err := exec.Command("env", "LD_LIBRARY_PATH="+dir, "ldd", found[0]).CombinedOutput()
			if err != nil || !strings.Contains(string(out), stripped) {
				t.Fatalf("ldd %s with the copy first: %v\n%s", found[0], err, out)
			}
			checkPythonFrames(t, v, found[0], []string{"LD_LIBRARY_PATH=" + dir}, script, threads, "_ctypes_callproc")
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

// checkPythonFrames records python (CPython v) running pyframes.py, with
// env added to the environment, and checks the Python frames of its
// allocations: they stand between the native frame call (ctypes' call
// into the stand-in) and Py_RunMain.
func checkPythonFrames(t *testing.T, v, python string, env []string, script, threads, call string) {
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
	ctx := testContext(t)
	dir := t.TempDir()
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "py.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, env...)},
		"--lib", fakeLib, "-o", trace, "--", python, script, fakeLib, threads)
	rec.finish(t, 60*time.Second)
	truth := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
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
	var py, native []string
	first, last := -1, -1
	for i, f := range nested.Frames {
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
	if strings.Join(py, "\n") != strings.Join(want, "\n") {
		t.Fatalf("Python frames:\n%s\nwant:\n%s", strings.Join(py, "\n"), strings.Join(want, "\n"))
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
