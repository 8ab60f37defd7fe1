package vmtest

import (
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/tracefile"
)

// omitFPChain builds testdata/omitfp_*.c, every file -O2
// -fomit-frame-pointer -g, into dir: an executable and two libraries over
// the runtime stand-in. lib2 is left as built ("full"), stripped to .dynsym
// ("dynsym"), or stripped with only MiniDebugInfo ("mini", Fedora's recipe).
// With nested, lib1 calls the runtime over the driver stand-in (libnestrt:
// cudaMalloc calls cuMemAlloc_v2, both probed) instead of the runtime
// stand-in.
func omitFPChain(t *testing.T, dir, lib2 string, nested bool) string {
	t.Helper()
	src := func(name string) string { p, _ := filepath.Abs(filepath.Join("testdata", name)); return p }
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	cflags := []string{"-O2", "-fomit-frame-pointer", "-g", "-Wall"}
	lib2Path := filepath.Join(dir, "libomit2.so")
	run("gcc", append(cflags, "-shared", "-fPIC", "-Wl,-soname,libomit2.so", "-o", lib2Path, src("omitfp_lib2.c"))...)
	runtime := []string{"-L" + fakeLibDir, "-lcudart"}
	if nested {
		runtime = []string{nestRuntime, fakeDriver}
	}
	run("gcc", append(append(cflags, "-shared", "-fPIC", "-Wl,-soname,libomit1.so", "-o", filepath.Join(dir, "libomit1.so"),
		src("omitfp_lib1.c"), "-L"+dir, "-lomit2"), append(runtime, "-Wl,-rpath,"+dir+":"+fakeLibDir)...)...)
	exe := filepath.Join(dir, "omitfp")
	// The executable names the runtime too: its run path, not the system's
	// (where NVIDIA's real libcuda.so.1 is), must resolve libnestrt's
	// libcuda.so.1.
	run("gcc", append(append(cflags, "-o", exe, src("omitfp_main.c"), "-L"+dir, "-lomit1", "-lomit2", "-Wl,--no-as-needed"),
		append(runtime, "-Wl,-rpath,"+dir+":"+fakeLibDir)...)...)
	switch lib2 {
	case "dynsym":
		run("strip", "--strip-all", lib2Path)
	case "mini":
		// The functions .dynsym lacks, from the full symbol table, in an
		// xz-compressed ELF in .gnu_debugdata; the rest stripped.
		f, err := elf.Open(lib2Path)
		if err != nil {
			t.Fatal(err)
		}
		syms, _ := f.Symbols()
		dyn, _ := f.DynamicSymbols()
		f.Close()
		exported := map[string]bool{}
		for _, s := range dyn {
			exported[s.Name] = true
		}
		var keep []string
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && !exported[s.Name] {
				keep = append(keep, s.Name)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "keep"), []byte(strings.Join(keep, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		run("objcopy", "--only-keep-debug", lib2Path, "lib2.debug")
		run("objcopy", "-S", "--remove-section", ".gdb_index", "--remove-section", ".comment",
			"--keep-symbols=keep", "lib2.debug", "mini")
		run("xz", "-f", "mini")
		run("strip", "--strip-all", lib2Path)
		run("objcopy", "--add-section", ".gnu_debugdata=mini.xz", lib2Path)
	}
	return exe
}

// omitFPFrames is the omitfp chain's stack, innermost first, as
// "function file:line".
func omitFPFrames(t *testing.T) []string {
	t.Helper()
	var want []string
	for _, tag := range []struct{ file, fn string }{
		{"omitfp_lib1.c", "lib1_inner"}, {"omitfp_lib2.c", "lib2_hidden"}, {"omitfp_lib2.c", "lib2_middle"},
		{"omitfp_lib1.c", "lib1_outer"}, {"omitfp_main.c", "main"},
	} {
		want = append(want, frameString(tag.fn, tag.file, markedLine(t, tag.file, tag.fn)))
	}
	return want
}

// markedLine finds the line of testdata/file marked "// LINE:tag".
func markedLine(t *testing.T, file, tag string) int {
	t.Helper()
	return lineEnding(t, file, "// LINE:"+tag)
}

// lineEnding returns the number of the first line of testdata/file that
// ends with marker.
func lineEnding(t *testing.T, file, marker string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, marker) {
			return i + 1
		}
	}
	t.Fatalf("no %q in %s", marker, file)
	return 0
}

// recordOneStack records exe, which allocates once and exits, probing
// libs, and returns the frames of its one stack as "function file:line"
// strings.
func recordOneStack(t *testing.T, exe string, libs []string, args ...string) []string {
	t.Helper()
	ctx := testContext(t)
	dir := filepath.Dir(exe)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "omitfp.trace")
	for _, l := range libs {
		args = append(args, "--lib", l)
	}
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		append(append([]string{"-o", trace}, args...), "--", exe)...)
	rec.finish(t, 30*time.Second)
	out := oneStack(t, ctx, log, trace)
	// The window stays in the trace only when asked to.
	keep := slices.Contains(args, "--keep-stack-windows")
	if n := windowsInTrace(t, trace); (n == 1) != keep {
		t.Errorf("%d records in the trace carry a stack window; want %d", n, map[bool]int{true: 1}[keep])
	}
	return out
}

// oneStack is the frames of the one allocation of the one process the
// stand-in's log at log names, as the report of trace has them:
// "function file:line" strings, innermost first.
func oneStack(t *testing.T, ctx context.Context, log, trace string) []string {
	t.Helper()
	want := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	if p := rep.process(want.PID); p == nil || p.Allocs != 1 {
		t.Fatalf("report has process %+v, want pid %d with 1 allocation", p, want.PID)
	}
	var stacks []reportStack
	for _, s := range rep.Stacks {
		if s.PID == want.PID {
			stacks = append(stacks, s)
		}
	}
	if len(stacks) != 1 || stacks[0].Allocs != 1 {
		t.Fatalf("%d stacks for pid %d, want one of 1 allocation: %+v", len(stacks), want.PID, stacks)
	}
	var out []string
	for _, f := range stacks[0].Frames {
		out = append(out, frameString(f.Function, f.File, f.Line))
	}
	return out
}

// windowsInTrace counts the event records of a trace that carry a stack
// window.
func windowsInTrace(t *testing.T, path string) int {
	t.Helper()
	n := 0
	eachEvent(t, path, func(ev *events.Event) {
		if ev.Flags&events.FlagWindow != 0 && len(ev.Window) > 0 {
			n++
		}
	})
	return n
}

// eachEvent calls f with each event record of the trace at path, in order;
// the event is valid only during the call.
func eachEvent(t *testing.T, path string, f func(*events.Event)) {
	t.Helper()
	eachFrame(t, path, func(fr *tracefile.Record) {
		if fr.Type == tracefile.TypeEvent {
			f(fr.Event)
		}
	})
}

// eachFrame calls f with each frame of the trace at path, in order.
func eachFrame(t *testing.T, path string, f func(*tracefile.Record)) {
	t.Helper()
	r, err := tracefile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		f(&rec)
	}
}

func frameString(fn, file string, line int) string {
	if file == "" {
		return fn
	}
	return fmt.Sprintf("%s %s:%d", fn, filepath.Base(file), line)
}

// TestUnwindOmitFramePointer: an allocation at the end of a call chain
// built without frame pointers, through two shared libraries and back,
// in a process that exits right after it, is reported with every function
// and its file:line, in order, from the stack window the BPF program
// copied; the frame-pointer walk alone does not find them. A library
// stripped to .dynsym still names its exported functions (and no wrong
// name for its static one), and one with only MiniDebugInfo names both.
// Through a runtime that calls the driver (both probed: the driver call's
// uretprobe is pending inside the runtime's), the stack is the same: it is
// taken at the outer call's return, where no trampoline of ours is left
// above the stack pointer and the kernel has put the real return address
// in the instruction pointer.
func TestUnwindOmitFramePointer(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	for _, tool := range []string{"gcc", "strip", "objcopy", "xz"} {
		requireTool(t, tool)
	}
	full := omitFPFrames(t)
	for _, c := range []struct {
		lib2, window string
		nested, keep bool
		want         []string
	}{
		{"full", "", false, false, full},
		{"dynsym", "", false, false, []string{full[0], "", "lib2_middle", full[3], full[4]}},
		{"mini", "", false, false, []string{full[0], "lib2_hidden", "lib2_middle", full[3], full[4]}},
		{"full", "", true, false, full},
		// The window in the trace, unwound by report (replay).
		{"full", "", false, true, full},
		{"mini", "", false, true, []string{full[0], "lib2_hidden", "lib2_middle", full[3], full[4]}},
		{"full", "0", false, false, nil}, // frame pointers only
	} {
		name := c.lib2
		if c.nested {
			name += "/nested"
		}
		if c.keep {
			name += "/keep-stack-windows"
		}
		if c.window != "" {
			name += "/window=" + c.window
		}
		t.Run(name, func(t *testing.T) {
			exe := omitFPChain(t, t.TempDir(), c.lib2, c.nested)
			var args []string
			if c.window != "" {
				args = []string{"--stack-window", c.window}
			}
			if c.keep {
				args = append(args, "--keep-stack-windows")
			}
			libs := []string{fakeLib}
			if c.nested {
				libs = []string{nestRuntime, fakeDriver}
			}
			got := recordOneStack(t, exe, libs, args...)
			if c.want == nil {
				// Without the window the frame-pointer walk cannot climb
				// this chain: the test above proves the unwinder, not luck.
				if len(got) >= len(full) && strings.Join(got[:len(full)], "\n") == strings.Join(full, "\n") {
					t.Fatalf("the frame-pointer walk alone found the whole chain: %q", got)
				}
				return
			}
			if len(got) < len(c.want) || strings.Join(got[:len(c.want)], "\n") != strings.Join(c.want, "\n") {
				t.Fatalf("stack, innermost first:\n  got  %q\n  want %q (then libc's start code)", got, c.want)
			}
			// Below main: __libc_start_call_main, __libc_start_main, _start.
			if len(got) > len(c.want)+3 {
				t.Errorf("%d frames below main: %q", len(got)-len(c.want), got[len(c.want):])
			}
		})
	}
}

// TestUnwindCPython: CPython 3.10 to 3.13 (pyenv's builds, without frame
// pointers) allocating through ctypes. The frame-pointer walk stops within
// libffi; unwinding the stack window reaches the interpreter loop and
// Python's main, through libffi, _ctypes and libpython, in order. Python
// frames are left out (--no-python-frames): they would replace the
// interpreter loop's frames (TestPythonFrames checks them).
func TestUnwindCPython(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	script, _ := filepath.Abs(filepath.Join("testdata", "pynested.py"))
	// Innermost first; other frames may come between these.
	want := []string{"ffi_call", "_ctypes_callproc", "_PyEval_EvalFrameDefault", "Py_RunMain", "Py_BytesMain", "__libc_start_main", "_start"}
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			py := pyenvPython(t, v)
			ctx := testContext(t)
			dir := t.TempDir()
			for _, window := range []string{"", "0"} {
				log, trace := filepath.Join(dir, "fake"+window+".log"), filepath.Join(dir, "py"+window+".trace")
				args := []string{"--lib", fakeLib, "-o", trace, "--no-python-frames"}
				if window != "" {
					args = append(args, "--stack-window", window)
				}
				rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, append(args, "--", py, script, fakeLib)...)
				rec.finish(t, 30*time.Second)
				truth := onlyTruth(t, log, "")
				rep := runReport(t, ctx, trace)
				var fns []string
				n := 0
				for _, s := range rep.Stacks {
					if s.PID == truth.PID {
						n++
						for _, f := range s.Frames {
							fns = append(fns, f.Function)
						}
					}
				}
				if n != 1 {
					t.Fatalf("window %q: %d stacks for pid %d, want 1", window, n, truth.PID)
				}
				// The wanted functions, in order, as a subsequence.
				i := 0
				for _, fn := range fns {
					if i < len(want) && fn == want[i] {
						i++
					}
				}
				switch {
				case window == "" && i != len(want):
					t.Errorf("stack %q lacks %q (in order, after %q)", fns, want[i], want[:i])
				case window == "0" && i == len(want):
					t.Errorf("frame pointers alone found the whole stack %q: the test cannot tell unwinding from luck", fns)
				}
			}
		})
	}
}

// TestUnwindWindowSize: a stack deeper than the window is unwound as far
// as the window goes, and record says how many stacks it cut and what to
// do; --stack-window 64KiB reaches main.
func TestUnwindWindowSize(t *testing.T) {
	ctx, dir := traceSetup(t)
	src, _ := filepath.Abs(filepath.Join("testdata", "deepstack.c"))
	exe := filepath.Join(dir, "deepstack")
	if err := gcc("-O2", "-fomit-frame-pointer", "-g", "-Wall", "-o", exe, src,
		"-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		window string
		cut    bool
	}{{"16KiB", true}, {"64KiB", false}} {
		log, trace := filepath.Join(dir, c.window+".log"), filepath.Join(dir, c.window+".trace")
		// Every stack from its window (BPF's unwind, with
		// CUDATRACE_UNWIND=bpf, goes past it).
		rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, "CUDATRACE_UNWIND=window")},
			"--lib", fakeLib, "--stack-window", c.window, "-o", trace, "--", exe)
		rec.finish(t, 30*time.Second)
		truth := onlyTruth(t, log, "")
		rep := runReport(t, ctx, trace)
		var fns []string
		for _, s := range rep.Stacks {
			if s.PID == truth.PID {
				for _, f := range s.Frames {
					fns = append(fns, f.Function)
				}
			}
		}
		recursions := 0
		for recursions < len(fns) && fns[recursions] == "recurse" {
			recursions++
		}
		warned := strings.Contains(rec.stderr.String(), "cudatrace: 1 stack ends where its "+c.window+" stack window did")
		if c.cut {
			if recursions < 10 || recursions >= 41 || len(fns) != recursions || !warned {
				t.Errorf("window %s: %d of 41 recurse frames, %d frames, warned %v; want a cut stack of recurse frames only, and the warning",
					c.window, recursions, len(fns), warned)
			}
			continue
		}
		want := append(slices.Repeat([]string{"recurse"}, 41), "main", "__libc_start_call_main", "__libc_start_main", "_start")
		if !slices.Equal(fns, want) || warned {
			t.Errorf("window %s: stack %q (warned %v), want 41 recurse frames, main and libc's start, no warning", c.window, fns, warned)
		}
	}
}

// TestWindowEndsWithStack: BPF copies a thread's stack window only up to
// where its stack ends, when that is within the window: the main thread's
// at the stack pointer the program was entered with (8 bytes above it,
// _start's first slot), a glibc thread's at its thread pointer. What was
// left out holds no frame: each stack, from code without frame pointers,
// is unwound from the window to its first frame.
func TestWindowEndsWithStack(t *testing.T) {
	ctx, dir := traceSetup(t)
	trace := filepath.Join(dir, "stackend.trace")
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--keep-stack-windows", "-o", trace, "--", workload("stackend"))
	rec.finish(t, 30*time.Second)

	// What stackend said of each thread: tid → where its stack ends.
	re := regexp.MustCompile(`(?m)^stackend: (main|thread) tid=(\d+) fsbase=(0x[0-9a-f]+) start_stack=(0x[0-9a-f]+)$`)
	ends := map[uint32]uint64{}
	var pid int
	for _, m := range re.FindAllStringSubmatch(rec.stdout.String(), -1) {
		tid, _ := strconv.ParseUint(m[2], 10, 32)
		fs, _ := strconv.ParseUint(m[3], 0, 64)
		ss, _ := strconv.ParseUint(m[4], 0, 64)
		if m[1] == "main" {
			pid = int(tid)
			ends[uint32(tid)] = ss + 8
		} else {
			ends[uint32(tid)] = fs
		}
	}
	if len(ends) != 2 {
		t.Fatalf("stackend said %q; want a line for main and one for its thread", rec.stdout.String())
	}

	seen := 0
	eachEvent(t, trace, func(ev *events.Event) {
		if ev.API != events.CudaMalloc {
			return
		}
		seen++
		end, ok := ends[ev.TID]
		if !ok {
			t.Errorf("a cudaMalloc of thread %d, which stackend did not name", ev.TID)
			return
		}
		top := ev.Regs.SP + uint64(len(ev.Window))
		if ev.Flags&events.FlagWindow == 0 || top != end || len(ev.Window) >= 16<<10 {
			t.Errorf("thread %d: window of %d bytes from sp %#x, up to %#x; want it to end at %#x, the stack's end",
				ev.TID, len(ev.Window), ev.Regs.SP, top, end)
		}
	})
	if seen != 2 {
		t.Errorf("%d cudaMalloc records in the trace, want 2", seen)
	}

	rep := runReport(t, ctx, trace)
	var got [][]string
	for _, s := range rep.Stacks {
		if s.PID != pid {
			continue
		}
		var fns []string
		for _, f := range s.Frames {
			fns = append(fns, f.Function)
		}
		got = append(got, fns)
	}
	slices.SortFunc(got, slices.Compare) // main's, then the thread's ("worker")
	wantMain := []string{"take", "main", "__libc_start_call_main", "__libc_start_main", "_start"}
	wantThread := []string{"take", "worker", "start_thread", "clone3"} // glibc 2.34 on: clone3
	if len(got) != 2 || !slices.Equal(got[0], wantMain) || !slices.Equal(got[1], wantThread) {
		t.Errorf("stacks %q; want %q and %q", got, wantMain, wantThread)
	}
}
