package vmtest

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPythonFramesExitAtOnce: CPython 3.10 to 3.13 processes that exit
// right after their last allocation, with os._exit and with a normal
// interpreter exit (which frees the module's code objects), recorded ten
// times each. The recorder reads code objects behind the process: every
// Python frame of every stack is exact (file, line, function), or shown
// as an unresolved Python frame, without file or line, and counted in the
// report. Never a wrong frame: line 0, another line, or a garbage name.
func TestPythonFramesExitAtOnce(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	script, _ := filepath.Abs(filepath.Join("testdata", "pyexit.py"))
	at := func(tag, fn string) string {
		return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyexit.py", tag), fn)
	}
	// The Python frames each allocation may have, innermost first.
	valid := [][]string{
		{at("alloc", "alloc"), at("loop", "<module>")},
		{at("module", "<module>")},
	}
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			python := pyenvPython(t, v)
			for _, end := range []string{"_exit", "exit"} {
				resolved, unresolved := 0, 0
				for run := range 10 {
					r, u := checkExitRun(t, python, script, end, run, valid)
					resolved += r
					unresolved += u
				}
				t.Logf("CPython %s, %s: %d Python frames exact, %d unresolved in 10 runs", v, end, resolved, unresolved)
			}
		})
	}
}

// checkExitRun records one run of pyexit.py ending as end and checks its
// stacks' Python frames against valid; it returns how many were exact and
// how many unresolved.
func checkExitRun(t *testing.T, python, script, end string, run int, valid [][]string) (exact, unresolved int) {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "exit.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "--lib", fakeLib, "-o", trace, "--", python, script, fakeLib, end)
	rec.finish(t, 60*time.Second)
	truth := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	var allocs uint64
	for _, s := range rep.Stacks {
		if s.PID != truth.PID {
			continue
		}
		allocs += s.Allocs
		var py []reportFrame
		for _, f := range s.Frames {
			if f.Module == "[python]" {
				py = append(py, f)
			}
		}
		ok := false
		for _, want := range valid {
			if len(py) != len(want) {
				continue
			}
			ok = true
			for i, f := range py {
				switch {
				case strings.HasPrefix(f.Function, "[unresolved Python frame: ") && f.File == "" && f.Line == 0:
				case fmt.Sprintf("%s:%d:%s", f.File, f.Line, f.Function) == want[i]:
				default:
					ok = false
				}
			}
			if ok {
				break
			}
		}
		if !ok {
			t.Errorf("%s run %d: a stack of %d allocations has a wrong Python frame: %+v", end, run, s.Allocs, py)
			continue
		}
		for _, f := range py {
			if f.File == "" {
				unresolved++
			} else {
				exact++
			}
		}
	}
	if allocs != 30 {
		t.Errorf("%s run %d: %d allocations in the report's stacks, want 30", end, run, allocs)
	}
	for _, p := range rep.Processes {
		if p.PID == truth.PID && (unresolved > 0) != (p.UnresolvedPythonFrames > 0) {
			t.Errorf("%s run %d: stacks show %d unresolved Python frames, the report counts %d",
				end, run, unresolved, p.UnresolvedPythonFrames)
		}
	}
	if (unresolved > 0) != strings.Contains(rec.stderr.String(), "Python frames stayed unresolved") {
		t.Errorf("%s run %d: %d unresolved Python frames in the stacks; record said:\n%s", end, run, unresolved, rec.stderr.String())
	}
	return exact, unresolved
}
