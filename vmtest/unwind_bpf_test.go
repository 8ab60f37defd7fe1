package vmtest

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
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
			m := unwindCheckLine.FindStringSubmatch(rec.stderr.String())
			if m == nil {
				t.Fatalf("no unwind check line in:\n%s", rec.stderr.String())
			}
			n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
			t.Logf("%s", m[0])
			truth := onlyTruth(t, log, "")
			allocs := int(truth.Allocs)
			if n(3) != 0 {
				t.Errorf("%d stacks BPF unwound differ from the window's: %s", n(3), m[7])
			}
			// The rules come while it runs (a loaded machine's reader may
			// be a second or two behind): the later rounds at least.
			if n(2) < allocs/5 || n(4) != 0 {
				t.Errorf("%d of %d allocations' stacks unwound in BPF and checked (%d not checked); want a fifth or more, all checked", n(2), allocs, n(4))
			}
			if n(6) == 0 {
				t.Errorf("no stack fell back by a rule: the signal handler's should")
			}
		})
	}
}
