package vmtest

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// buildUWDeep builds testdata/uwdeep.c and its two libraries (and a third
// copy of the first, for dlopen) without frame pointers into dir.
func buildUWDeep(t *testing.T, dir string) (exe, late string) {
	t.Helper()
	src := func(name string) string { p, _ := filepath.Abs(filepath.Join("testdata", name)); return p }
	cflags := []string{"-O2", "-fomit-frame-pointer", "-g", "-Wall"}
	lib := func(name string, side int, extra ...string) {
		t.Helper()
		args := append(append([]string{}, cflags...), "-shared", "-fPIC", fmt.Sprintf("-DSIDE=%d", side),
			"-Wl,-soname,"+name, "-o", filepath.Join(dir, name), src("uwdeep_lib.c"))
		if err := gcc(append(args, extra...)...); err != nil {
			t.Fatal(err)
		}
	}
	rt := []string{"-L" + fakeLibDir, "-lcudart", "-Wl,-rpath," + dir + ":" + fakeLibDir}
	lib("libuw2.so", 2, rt...)
	lib("libuw1.so", 1, append([]string{"-L" + dir, "-luw2"}, rt...)...)
	lib("libuwlate.so", 1, append([]string{"-L" + dir, "-luw2"}, rt...)...)
	exe = filepath.Join(dir, "uwdeep")
	if err := gcc(append(append(cflags, "-o", exe, src("uwdeep.c"), "-L"+dir, "-luw1", "-luw2", "-pthread", "-ldl"), rt...)...); err != nil {
		t.Fatal(err)
	}
	return exe, filepath.Join(dir, "libuwlate.so")
}

// unwindCheck finds record's unwind check line in stderr and logs it: its
// counts by unwindCheckLine's group (1 unwound in BPF, 2 the same as the
// window's, 3 different, 4 not checked, 5 and 6 fallen back without rules
// and by a rule), and what differed.
func unwindCheck(t *testing.T, stderr string) (n func(group int) uint64, differ string) {
	t.Helper()
	m := unwindCheckLine.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no unwind check line in:\n%s", stderr)
	}
	t.Logf("%s", m[0])
	return func(i int) uint64 { v, _ := strconv.ParseUint(m[i], 10, 64); return v }, m[7]
}

var unwindCheckLine = regexp.MustCompile(`unwind check: (\d+) stacks unwound in BPF, (\d+) the same as the window's, (\d+) differ, (\d+) not checked; fell back: (\d+) without rules, (\d+) by a rule; (.*)`)

// TestUnwindInBPF: the stacks BPF unwinds from the call-frame rules
// loaded for each file are the user-space unwinder's on the same events,
// frame for frame (CUDATRACE_TEST_UNWIND_CHECK: BPF copies the window
// beside its frames, and record unwinds it too and compares): 100- and
// 20-frame chains through two libraries without frame pointers, by their
// PLTs, with alloca and tail calls on the way, on the main thread and
// another; an allocation in a signal handler (its stack passes
// __restore_rt, whose rules are DWARF expressions: BPF falls back to the
// window there, counted); a library dlopen'ed a moment before its
// allocation (falls back until its rules are loaded). The stacks are
// unwound in BPF once the files' rules are in.
func TestUnwindInBPF(t *testing.T) {
	ctx, dir := traceSetup(t)
	exe, late := buildUWDeep(t, dir)
	for _, depth := range []int{20, 100} {
		t.Run(strconv.Itoa(depth), func(t *testing.T) {
			log, trace := filepath.Join(dir, fmt.Sprintf("%d.log", depth)), filepath.Join(dir, fmt.Sprintf("%d.trace", depth))
			rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, "CUDATRACE_TEST_UNWIND_CHECK=1")},
				"--lib", fakeLib, "--stack-window", "64KiB", "-o", trace, "--", exe, "1000", strconv.Itoa(depth), late)
			rec.finish(t, 90*time.Second)
			n, differ := unwindCheck(t, rec.stderr.String())
			truth := onlyTruth(t, log, "")
			allocs := truth.Allocs
			if n(3) != 0 {
				t.Errorf("%d stacks BPF unwound differ from the window's: %s", n(3), differ)
			}
			// The rules come while it runs (a loaded machine's reader may
			// be a second or two behind): the later rounds at least.
			if n(2) < allocs/5 || n(4) != 0 {
				t.Errorf("%d of %d allocations' stacks unwound in BPF and checked (%d not checked); want a fifth or more, all checked", n(2), allocs, n(4))
			}
			if n(6) == 0 {
				t.Errorf("no stack fell back by a rule: the signal handler's should")
			}
			// Each round's main-thread allocation starts where the last
			// round's did, and the memo holds it (a new thread's stack
			// may be another's): a third of all at least.
			rep := runReport(t, ctx, trace)
			if memo := rep.Counters["unwound_from_memo"]; memo < allocs/3 || memo > n(2) {
				t.Errorf("%d stacks taken from the memo, want %d (a third of %d allocations) to %d (those unwound in BPF)", memo, allocs/3, allocs, n(2))
			}
		})
	}
}

// TestUnwindInBPFCPython: CPython 3.10 to 3.13 (pyenv's builds, without
// frame pointers) allocating through ctypes in a loop for 3 seconds. Once
// the rules for its files are in (here 1-2% of the loop's allocations
// come before them, and fall back to the window), BPF unwinds the stacks
// through libffi, _ctypes and the interpreter loop to python's main, each
// the user-space unwinder's unwind of the same event's window, frame for
// frame (CUDATRACE_TEST_UNWIND_CHECK). Python frames are left out
// (--no-python-frames): the interpreter loop's frames stay, by name.
func TestUnwindInBPFCPython(t *testing.T) {
	ctx, dir := traceSetup(t)
	script, _ := filepath.Abs(filepath.Join("testdata", "pyrepeat.py"))
	// Innermost first; other frames may come between these.
	want := []string{"ffi_call", "_ctypes_callproc", "_PyEval_EvalFrameDefault", "Py_RunMain", "Py_BytesMain", "__libc_start_main", "_start"}
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			py := pyenvPython(t, v)
			log, trace := filepath.Join(dir, v+".log"), filepath.Join(dir, v+".trace")
			rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, "CUDATRACE_TEST_UNWIND_CHECK=1")},
				"--lib", fakeLib, "--no-python-frames", "-o", trace, "--", py, script, fakeLib, "3")
			rec.finish(t, 90*time.Second)
			n, differ := unwindCheck(t, rec.stderr.String())
			truth := onlyTruth(t, log, "")
			if n(3) != 0 || n(4) != 0 {
				t.Errorf("%d stacks BPF unwound differ from the window's, %d not checked: %s", n(3), n(4), differ)
			}
			if n(2) < truth.Allocs/3 {
				t.Errorf("%d of %d allocations' stacks unwound in BPF and checked; want a third or more", n(2), truth.Allocs)
			}
			// Every stack BPF unwound reaches main, by name.
			var whole uint64
			rep := runReport(t, ctx, trace)
			for _, s := range rep.Stacks {
				i := 0
				for _, f := range s.Frames {
					if i < len(want) && f.Function == want[i] {
						i++
					}
				}
				if i == len(want) {
					whole += s.Allocs
				}
			}
			if whole < n(1) {
				t.Errorf("%d allocations' stacks have %q in order, want all %d unwound in BPF at least", whole, want, n(1))
			}
		})
	}
}

// TestUnwindMemo: a stack BPF takes from its memo is the one it would
// unwind. uwmemo.c allocates from one place and one stack pointer through
// two call chains (main < by_a < leaf, main < mid < by_b < leaf), 300
// times through the first, 300 through the second, 300 through the first
// again: every unwind starts at the same pc and sp, and the chains'
// return addresses to main are at one address. The stacks are those
// of the window's unwind, frame for frame (CUDATRACE_TEST_UNWIND_CHECK),
// most of them from the memo, and the report has each caller's
// allocations under its own stack.
func TestUnwindMemo(t *testing.T) {
	ctx, dir := traceSetup(t)
	exe := workload("uwmemo")
	const rounds = 300
	log, trace := filepath.Join(dir, "memo.log"), filepath.Join(dir, "memo.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, "CUDATRACE_TEST_UNWIND_CHECK=1")},
		"--lib", fakeLib, "-o", trace, "--", exe, strconv.Itoa(rounds))
	rec.finish(t, 90*time.Second)
	n, differ := unwindCheck(t, rec.stderr.String())
	if n(3) != 0 || n(4) != 0 {
		t.Errorf("%d stacks BPF unwound differ from the window's, %d not checked: %s", n(3), n(4), differ)
	}
	rep := runReport(t, ctx, trace)
	// The first records of the run come before the rules for its files
	// (they fall back to the window); every change of caller after that
	// is a stack the memo does not hold.
	memo := rep.Counters["unwound_from_memo"]
	if memo < 2*rounds || memo > n(2) {
		t.Errorf("%d stacks taken from the memo, want %d to %d (those unwound in BPF)", memo, 2*rounds, n(2))
	}
	// Both chains start their unwinds at one pc and sp: each change of
	// chain once the rules are in finds the other's memo, which does not
	// hold.
	if changed := rep.Counters["unwind_memo_changed"]; changed < 1 || changed > 2 {
		t.Errorf("%d memos found not to hold, want 1 or 2 (a change of call chain: by_a to by_b, back to by_a)", changed)
	}
	truth := onlyTruth(t, log, "")
	if truth.Allocs != 3*rounds {
		t.Fatalf("ground truth: %d allocations, want %d", truth.Allocs, 3*rounds)
	}
	by := map[string]uint64{}
	for _, s := range rep.Stacks {
		var names []string
		for _, f := range s.Frames {
			names = append(names, f.Function)
		}
		i := slices.Index(names, "leaf")
		switch {
		case i >= 0 && i+2 < len(names) && names[i+1] == "by_a" && names[i+2] == "main":
			by["by_a"] += s.Allocs
		case i >= 0 && i+3 < len(names) && names[i+1] == "by_b" && names[i+2] == "mid" && names[i+3] == "main":
			by["by_b"] += s.Allocs
		default:
			t.Errorf("stack of %d allocations: %s, want leaf < by_a < main or leaf < by_b < mid < main", s.Allocs, strings.Join(names, " < "))
		}
	}
	if by["by_a"] != 2*rounds || by["by_b"] != rounds || len(by) != 2 {
		t.Errorf("allocations by caller: %v, want by_a %d, by_b %d", by, 2*rounds, rounds)
	}
}

// TestUnwindMemoWide: a stack whose words lie further apart than BPF's
// memo reads at once, more spans of them than it keeps, and a page not
// present among the words of one, is taken from the memo the same as it
// was unwound. uwwide.c allocates ROUNDS times through ~110 KiB of stack
// (main < wide x12 < holed < leaf), past what a window holds: its frames
// are checked by name. A span whose read fails, or a word past the last
// span, is read with its page: the stack is the same, and still from
// the memo.
func TestUnwindMemoWide(t *testing.T) {
	ctx, dir := traceSetup(t)
	const rounds = 300
	log, trace := filepath.Join(dir, "wide.log"), filepath.Join(dir, "wide.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeLib, "-o", trace, "--", workload("uwwide"), strconv.Itoa(rounds))
	rec.finish(t, 90*time.Second)
	if truth := onlyTruth(t, log, ""); truth.Allocs != rounds {
		t.Fatalf("ground truth: %d allocations, want %d", truth.Allocs, rounds)
	}
	rep := runReport(t, ctx, trace)
	want := append(append([]string{"leaf", "holed"}, slices.Repeat([]string{"wide"}, 12)...), "main")
	var unwound uint64
	for _, s := range rep.Stacks {
		var names []string
		for _, f := range s.Frames {
			names = append(names, f.Function)
		}
		if len(names) < len(want) || !slices.Equal(names[:len(want)], want) {
			// The first records, before the rules for the files are
			// loaded, take the window's unwind: cut short at its end
			// (16 KiB), or at holed's page not present.
			if len(names) >= 2 && len(names) < len(want) && slices.Equal(names, want[:len(names)]) {
				continue
			}
			t.Errorf("stack of %d allocations: %s, want %s", s.Allocs, strings.Join(names, " < "), strings.Join(want, " < "))
			continue
		}
		unwound += s.Allocs
	}
	t.Logf("%d of %d allocations with the whole stack, %d from the memo", unwound, rounds, rep.Counters["unwound_from_memo"])
	// The rules come while it runs: most rounds are after.
	if unwound < rounds/2 {
		t.Errorf("%d of %d allocations with the whole stack, want half or more", unwound, rounds)
	}
	// Every round's allocation starts where the last one's did.
	if memo := rep.Counters["unwound_from_memo"]; memo+rounds/2 < unwound || memo > unwound {
		t.Errorf("%d stacks taken from the memo, want up to %d (those with the whole stack) and at most %d fewer", memo, unwound, rounds/2)
	}
	if changed := rep.Counters["unwind_memo_changed"]; changed != 0 {
		t.Errorf("%d memos found not to hold, want 0: the stack is the same every round", changed)
	}
}
