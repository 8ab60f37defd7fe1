package vmtest

// A worker that renames itself (issue 37): Ray's workers, and anything
// else that calls setproctitle, write their title over the memory their
// arguments and environment were laid out in, before their first CUDA
// call. Their job and rank, which live in that environment, are still
// theirs under the agent and under record --pid attached after the
// rename. A real setproctitle (Debian's python3-setproctitle, for its
// python3.11) on a torchrun rank's environment. Privileged.

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// titlePython is Debian's python3.11 with setproctitle importable, or a
// skip (a failure in CI).
func titlePython(t *testing.T) string {
	t.Helper()
	const py = "/usr/bin/python3.11"
	if err := exec.Command(py, "-c", "import setproctitle").Run(); err != nil {
		skipOrFail(t, "%s with setproctitle (Debian's python3-setproctitle: scripts/deps.sh) is needed: %v", py, err)
	}
	return py
}

// startTitled starts testdata/pytitle.py as rank 3 of a torchrun job of
// 4: it has renamed itself "ray::Worker" once it says ready, and has not
// loaded the runtime yet.
func startTitled(t *testing.T, ctx context.Context, log string) (*job, []string) {
	t.Helper()
	script, _ := filepath.Abs(filepath.Join("testdata", "pytitle.py"))
	cmd := exec.CommandContext(ctx, titlePython(t), script, fakeLib)
	cmd.Env = fakeEnv(log, launchers[0].env(3, 1, 0, 4)...)
	j := startCmdJob(t, "pytitle.py", cmd)
	// The rename took: what /proc shows is the title, as ps shows it.
	if out, err := exec.Command("ps", "-o", "args=", "-p", strconv.Itoa(j.pid)).Output(); err != nil ||
		strings.TrimSpace(string(out)) != "ray::Worker" {
		t.Fatalf("ps shows pid %d as %q (%v), want ray::Worker", j.pid, out, err)
	}
	return j, cmd.Args
}

// TestTitleAgent: under the agent, the renamed worker's metrics carry its
// job and rank, and a trace window of it its command line as it started
// (the agent read the worker at its loader's first note, as it started).
func TestTitleAgent(t *testing.T) {
	ctx, dir := traceSetup(t)
	a := startAgent(t, ctx)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "window.trace")
	j, args := startTitled(t, ctx, log)
	j.do(t, "ok", "%d", 1<<20)
	traceWindow(t, a.url, j.pid, 2, trace, func() { j.do(t, "ok", "%d", 2<<20) })
	var rep struct {
		Processes []struct {
			PID     int      `json:"pid"`
			Cmdline []string `json:"cmdline"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(cudatrace(t, ctx, "report", trace, "--json"), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Processes) != 1 || rep.Processes[0].PID != j.pid || !slices.Equal(rep.Processes[0].Cmdline, args) {
		t.Errorf("the trace window's processes %+v, want pid %d with its command line %q", rep.Processes, j.pid, args)
	}
	pid := strconv.Itoa(j.pid)
	var samples []sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		samples = parseMetrics(t, get(t, ctx, a.url+"/metrics", 200))
		if v, ok := metric(t, samples, "cudatrace_live_bytes", "pid", pid, "gpu", "0", "level", "segment"); ok && v == 3<<20 ||
			time.Now().After(deadline) {
			break
		}
	}
	wantMetric(t, samples, 3<<20, "cudatrace_live_bytes", "pid", pid, "job_id", launchers[0].job, "rank", "3",
		"gpu", "0", "level", "segment")
	if t.Failed() {
		t.Logf("its samples: %+v", samplesOf(samples, "cudatrace_live_bytes", "pid", pid))
	}
	if s := a.stderr.String(); strings.Contains(s, "its job and rank are unknown") {
		t.Errorf("the agent warned of an unknown job:\n%s", s)
	}
}

// TestTitleAttach: record --pid, attached after the worker renamed
// itself, names its job and rank in report --json.
func TestTitleAttach(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "title.trace")
	j, _ := startTitled(t, ctx, log)
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--pid", strconv.Itoa(j.pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	j.do(t, "ok", "%d", 5<<20)
	j.in.Close()
	if err := j.cmd.Wait(); err != nil {
		t.Fatalf("pytitle.py: %v", err)
	}
	rec.finish(t, 20*time.Second) // ends by itself once its target has exited
	if s := rec.stderr.String(); strings.Contains(s, "its job and rank are unknown") {
		t.Errorf("record warned of an unknown job:\n%s", s)
	}
	rep := jobsOf(t, ctx, trace)
	var found bool
	for _, p := range rep.Processes {
		if p.PID != j.pid {
			continue
		}
		found = true
		if p.Job == nil || p.Job.ID != launchers[0].job || p.Job.Rank == nil || *p.Job.Rank != 3 || p.Job.WorldSize != 4 {
			t.Errorf("pid %d: job %s, want rank 3 of 4 in %s", p.PID, jsonOf(p.Job), launchers[0].job)
		}
		if p.Live != 5<<20 {
			t.Errorf("pid %d: %d bytes live, want %d", p.PID, p.Live, 5<<20)
		}
	}
	if !found {
		t.Fatalf("pid %d is not in the report", j.pid)
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
