package vmtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// TestPythonFramesExitAtOnce: CPython 3.10 to 3.13 (pyenv's), and Debian
// sid's 3.14 and newest 3.13 in a container of their own, processes that exit
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
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13", "sid-3.13", "sid-3.14"} {
		t.Run(v, func(t *testing.T) {
			script := script
			command := func(end string) []string { return []string{pyenvPython(t, v), script, fakeLib, end} }
			if sv, ok := strings.CutPrefix(v, "sid-"); ok {
				root, python := sidPython(t, sv)
				script = copyToTemp(t, script)
				command = func(end string) []string {
					return []string{"unshare", "-m", "sh", "-c",
						testenv.RootScript(root, []string{"/tmp"}, python, script, fakeLib, end)}
				}
			}
			at := func(tag, fn string) string {
				return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyexit.py", tag), fn)
			}
			// The Python frames each allocation may have, innermost first.
			valid := [][]string{
				{at("alloc", "alloc"), at("loop", "<module>")},
				{at("module", "<module>")},
			}
			for _, end := range []string{"_exit", "exit"} {
				resolved, unresolved := 0, 0
				for run := range 10 {
					r, u := checkExitRun(t, command(end), end, run, valid)
					resolved += r
					unresolved += u
				}
				t.Logf("CPython %s, %s: %d Python frames exact, %d unresolved in 10 runs", v, end, resolved, unresolved)
			}
		})
	}
}

// sidPython is Debian sid's CPython v in the sid root scripts/deps.sh
// makes (its libc is newer than the host's): the root and the
// interpreter's path inside it. The tests run it in a container of its
// own with that root (testenv.RootScript), /tmp bind-mounted into it.
func sidPython(t *testing.T, v string) (root, python string) {
	t.Helper()
	for _, tool := range []string{"unshare", "pivot_root", "mount", "umount"} {
		requireTool(t, tool)
	}
	return testenv.SidPython(t, v)
}

// copyToTemp copies file into a test directory (under /tmp) and returns
// the copy's path.
func copyToTemp(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(file))
	if err := os.WriteFile(out, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkExitRun records one run of command (pyexit.py ending as end) and checks its
// stacks' Python frames against valid; it returns how many were exact and
// how many unresolved.
func checkExitRun(t *testing.T, command []string, end string, run int, valid [][]string) (exact, unresolved int) {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "exit.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, append([]string{"--lib", fakeLib, "-o", trace, "--"}, command...)...)
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
