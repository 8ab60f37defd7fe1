package vmtest

// A tracer fails open: nothing a traced process does waits for the
// reader, and what BPF saw is not lost because the reader came late.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReaderAway: with the tracer stopped (SIGSTOP) right after it
// attached, a launched job runs to its end: a CPython process allocating
// from 200 call sites new to it, then leaving with os._exit, and a C
// program built without frame pointers that exits right after its one
// allocation. Neither is ever looked at by the reader while it lives. Once
// the tracer runs again, the report is exact all the same: the ledgers,
// each of the 200 allocations' Python lines (their code objects captured
// by BPF, none unresolved), and the C program's native stack through code
// without frame pointers (its mappings from its loader's list).
func TestReaderAway(t *testing.T) {
	ctx, dir := traceSetup(t)
	python := pyenvPython(t, "3.12")
	w := newNobodyWorld(t)
	exe := omitFPChain(t, filepath.Join(dir), "full", false)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "away.trace")
	done := filepath.Join(dir, "done")
	stdin, feed, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { feed.Close() })
	script := fmt.Sprintf("read x; echo go | %s %s %s %s exit && %s && touch %s", python, w.script, fakeLib, w.sites, exe, done)
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log), Stdin: stdin},
		"--lib", fakeLib, "-o", trace, "--", "sh", "-c", script)
	stdin.Close()
	rec.waitAttached(t, 30*time.Second)
	// The interpreters installed here are learned before record says it
	// attached (record/python.go pyFileSet.learnSystem): the tracer is
	// stopped as soon as it has launched the command, and the job's
	// first allocation still gets its frames.
	tracer := rec.cmd.Process.Pid
	if _, ok := waitFor(10*time.Second, func() bool { return launched(tracer) }); !ok {
		t.Fatal("record did not launch its command within 10 s")
	}
	if err := syscall.Kill(tracer, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			syscall.Kill(tracer, syscall.SIGCONT)
		}
	})
	fmt.Fprintln(feed, "go")
	took, ok := waitFor(30*time.Second, func() bool { _, err := os.Stat(done); return err == nil })
	if !ok {
		t.Fatal("with the tracer stopped, the job did not get through within 30 s: something waited for it")
	}
	if procState(tracer) != 'T' {
		t.Fatalf("the tracer is not stopped (state %q): the test proves nothing", procState(tracer))
	}
	t.Logf("the job got through in %v with the tracer stopped", took.Round(time.Millisecond))
	resumed = true
	syscall.Kill(tracer, syscall.SIGCONT)
	if code := rec.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("record exited %d", code)
	}
	if strings.Contains(rec.stderr.String(), "lost") {
		t.Errorf("record lost events:\n%s", rec.stderr.String())
	}

	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	var py, c *procTruth
	for _, tr := range truths {
		switch tr.Allocs {
		case 200:
			py = tr
		case 1:
			c = tr
		}
	}
	if py == nil || c == nil || len(truths) != 2 {
		t.Fatalf("ground truth of %d processes, want the Python job's 200 allocations and omitfp's 1", len(truths))
	}
	rep := runReportArgs(t, ctx, trace, "--top", "500")
	checkProcess(t, rep, py, 0, "python3.12")
	checkProcess(t, rep, c, 0, "omitfp")
	if p := rep.process(py.PID); p != nil && p.UnresolvedPythonFrames != 0 {
		t.Errorf("%d Python frames unresolved, want 0", p.UnresolvedPythonFrames)
	}
	checkSites(t, rep, py.PID, w.sites, w.script)
	want := []string{"lib1_inner", "lib2_hidden", "lib2_middle", "lib1_outer", "main"}
	for _, s := range rep.Stacks {
		if s.PID != c.PID {
			continue
		}
		var got []string
		for _, f := range s.Frames {
			got = append(got, f.Function)
		}
		if len(got) < len(want) || !slices.Equal(got[:len(want)], want) {
			t.Errorf("omitfp's stack %q, want it to begin %q", got, want)
		}
	}
}

// launched says whether process pid has a child that runs another
// program: record's launch helper (itself) has become the command. Go
// forks from whichever of its threads runs the goroutine, so each
// thread's list is read.
func launched(pid int) bool {
	self, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, c := range strings.Fields(string(b)) {
			if exe, err := os.Readlink("/proc/" + c + "/exe"); err == nil && exe != self {
				return true
			}
		}
	}
	return false
}
