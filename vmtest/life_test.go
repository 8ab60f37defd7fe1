package vmtest

// A process's life on a node that runs for months: a PID a traced process
// had, taken after its end by an unrelated process, is not traced; a node
// that has run more Python processes than any BPF map holds still names
// a later job's Python lines; the maps keyed by process hold only what is
// alive. Each of these failed before the process's end removed it from
// every BPF map (bpf/exit.h) and one owner ended its state in user space
// (record/life.go).

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runAtPID runs argv (with env added to the stand-in's) as the process
// with PID pid, outside any traced process's descendants.
func runAtPID(t *testing.T, ctx context.Context, pid int, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(ctx, workload("pidat"), append([]string{strconv.Itoa(pid)}, argv...)...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// waitGone waits until no process has PID pid.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still running after 20s", pid)
		}
	}
}

// checkNotTraced checks a trace's report: the process with PID pid is the
// traced rank alone (its figures its ground truth's, its rank 5 of job
// "traced"), once, or, when it made no record while traced (attached
// after its allocations: allocated, then absent), not at all; nothing of
// the unrelated process that took its PID (job "other", rank 3) is in it.
func checkNotTraced(t *testing.T, ctx context.Context, trace string, pid int, truth *procTruth, allocated bool) {
	t.Helper()
	rep := jobsOf(t, ctx, trace)
	n := 0
	for _, p := range rep.Processes {
		if p.Job != nil && (p.Job.ID == "torchrun:other" || p.Job.Rank != nil && *p.Job.Rank == 3) {
			t.Errorf("pid %d carries job %q rank %v: the unrelated process that took a traced PID", p.PID, p.Job.ID, *p.Job.Rank)
		}
		if p.PID != pid {
			continue
		}
		n++
		if p.Job == nil || p.Job.ID != "torchrun:traced" || p.Job.Rank == nil || *p.Job.Rank != 5 {
			t.Errorf("pid %d: job %+v, want rank 5 of job traced", pid, p.Job)
		}
		if allocated && (p.Live != truth.Live || p.Peak != truth.Peak) {
			t.Errorf("pid %d: live %d peak %d, want the rank's own %d and %d (the unrelated one's counted in)", pid, p.Live, p.Peak, truth.Live, truth.Peak)
		}
	}
	if n > 1 || allocated && n != 1 {
		t.Errorf("pid %d is %d processes of the report, want 1", pid, n)
	}
	for _, j := range rep.Jobs {
		if j.ID == "torchrun:other" {
			t.Errorf("job other in the report: %+v", j)
		}
	}
}

// reuseWorld is a PID-reuse test's files: the traced ranks' and the
// unrelated process's ready/go directories and stand-in logs, the trace.
type reuseWorld struct{ dir, ranks, others, log, otherLog, trace string }

func reuseSetup(t *testing.T) (context.Context, reuseWorld) {
	t.Helper()
	ctx, dir := traceSetup(t)
	w := reuseWorld{dir: dir, ranks: filepath.Join(dir, "ranks"), others: filepath.Join(dir, "others"),
		log: filepath.Join(dir, "fake.log"), otherLog: filepath.Join(dir, "other.log"), trace: filepath.Join(dir, "job.trace")}
	for _, d := range []string{w.ranks, w.others} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return ctx, w
}

// A launched job's rank ends, and an unrelated process (not a descendant
// of the command) is given its PID and allocates: record -- CMD traces the
// rank and not the other.
func TestPIDReuseLaunched(t *testing.T) {
	ctx, w := reuseSetup(t)
	ranks, others, log, otherLog, trace := w.ranks, w.others, w.log, w.otherLog, w.trace
	end := filepath.Join(w.dir, "end")
	script := fmt.Sprintf("RANK=5 WORLD_SIZE=8 TORCHELASTIC_RUN_ID=traced %s %s; while [ ! -e %s ]; do sleep 0.05; done",
		workload("rankjob"), ranks, end)
	rec := exec.CommandContext(ctx, tracerBin, "record", "--lib", fakeLib, "-o", trace, "--", "sh", "-c", script)
	rec.Env = fakeEnv(log)
	out := newLockedBuffer("")
	rec.Stdout, rec.Stderr = out, out
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	pid := waitReady(t, ranks, []int{5})[5]
	letGo(t, ranks, 5)
	waitGone(t, pid)
	other := runAtPID(t, ctx, pid, fakeEnv(otherLog, "RANK=3", "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=other"),
		workload("rankjob"), others)
	if got := waitReady(t, others, []int{3})[3]; got != pid {
		t.Fatalf("the unrelated process has pid %d, want %d", got, pid)
	}
	letGo(t, others, 3)
	if err := other.Wait(); err != nil {
		t.Fatalf("the unrelated rankjob: %v", err)
	}
	if err := os.WriteFile(end, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := rec.Wait(); err != nil {
		t.Fatalf("record: %v\n%s", err, out.String())
	}
	checkNotTraced(t, ctx, trace, pid, onlyTruth(t, log, ""), true)
}

// record --pid of two ranks: one ends and an unrelated process takes its
// PID and allocates, then lives on; the other ends. The unrelated process
// is not traced, and the recording ends when both ranks have ended,
// though a process with the first one's PID is still running.
func TestPIDReuseAttached(t *testing.T) {
	ctx, w := reuseSetup(t)
	ranks, others, log, otherLog, trace := w.ranks, w.others, w.log, w.otherLog, w.trace
	for _, r := range []int{5, 6} {
		cmd := exec.CommandContext(ctx, workload("rankjob"), ranks)
		cmd.Env = fakeEnv(log, fmt.Sprintf("RANK=%d", r), "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=traced")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait() //nolint:errcheck // its ground truth is its log
	}
	pids := waitReady(t, ranks, []int{5, 6})
	rec := exec.CommandContext(ctx, tracerBin, "record", "--lib", fakeLib, "-o", trace, "--duration", "2m",
		"--pid", strconv.Itoa(pids[5]), "--pid", strconv.Itoa(pids[6]))
	out := newLockedBuffer(attachedLine)
	rec.Stdout, rec.Stderr = out, out
	if err := rec.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- rec.Wait() }()
	select {
	case <-out.seen:
	case err := <-done:
		t.Fatalf("record ended before it attached: %v\n%s", err, out.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("record did not attach within 60s:\n%s", out.String())
	}
	letGo(t, ranks, 5)
	waitGone(t, pids[5])
	other := runAtPID(t, ctx, pids[5], fakeEnv(otherLog, "RANK=3", "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=other"),
		workload("rankjob"), others)
	defer func() {
		letGo(t, others, 3)
		other.Wait() //nolint:errcheck // done with it
	}()
	if got := waitReady(t, others, []int{3})[3]; got != pids[5] {
		t.Fatalf("the unrelated process has pid %d, want %d", got, pids[5])
	}
	letGo(t, ranks, 6)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("record: %v\n%s", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("record still running 20s after both traced ranks ended (a process has pid %d: not the rank it traced)\n%s",
			pids[5], out.String())
	}
	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	checkNotTraced(t, ctx, trace, pids[5], truths[pids[5]], false)
}

// A node that has run tens of thousands of processes (20,000 short
// native programs, dynamically linked so the loader's probe notes each,
// and more Python processes than BPF's per-process maps hold: 4096
// CPython layouts before), none of them touching CUDA, and then a Python
// CUDA job under the agent as shipped (the DaemonSet's capabilities): the
// job's ledger is exact and its allocations carry their Python lines,
// nothing is lost, and every BPF map keyed by process holds about what is
// alive. (PIDs wrapping, which this host's pid_max of 32768 takes hours
// to, is TestSoak's, in a guest.)
func TestAgentManyPythonProcesses(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "setpriv")
	churn := "/usr/bin/python3.11" // an interpreter the agent teaches BPF at its start
	if _, err := os.Stat(churn); err != nil {
		skipOrFail(t, "Debian's python3.11 is needed: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ag := startAgentWrapped(t, ctx, shippedWrap(shippedCaps(t)), nil, "--lib", fakeLib, "--dump-dir", "")
	const natives, pythons = 20000, 4500
	const runs = natives + pythons
	for _, c := range []struct {
		n    int
		argv string
	}{{natives, "/bin/true"}, {pythons, churn + " -c pass"}} {
		start := time.Now()
		sh := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do %s || exit 1; i=$((i+1)); done`, c.n, c.argv))
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("%d runs of %s: %v\n%s", c.n, c.argv, err, out)
		}
		t.Logf("%d runs of %s in %v", c.n, c.argv, time.Since(start).Round(time.Millisecond))
	}

	script, _ := filepath.Abs(filepath.Join("testdata", "pyagent.py"))
	log := filepath.Join(t.TempDir(), "job.log")
	j := startPyJob(t, ctx, pyenvPython(t, "3.11"), script, log)
	pid := strconv.Itoa(j.pid)
	const wBytes = 3 << 20
	j.do(t, "ok", "weights %d", wBytes)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		if n, _ := metric(t, m, "cudatrace_allocations_total", "pid", pid, "level", "segment"); n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not count pid %s's 2 allocations within 15s", pid)
		}
	}
	frame := func(fn, tag string) string {
		return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyagent.py", tag), fn)
	}
	want := strings.Join([]string{frame("cuda_malloc", "malloc"), frame("load_weights", "weights"), frame("<module>", "loop")}, "\n")
	p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%s", ag.url, pid))
	found := false
	var got []string
	for _, s := range p.Sample {
		k := strings.Join(pythonLocations(s, script), "\n")
		got = append(got, k)
		if k == want && s.Value[1] == wBytes {
			found = true
		}
	}
	if !found {
		t.Errorf("after %d processes, the job's %d bytes from load_weights lack their Python lines; samples' Python frames: %q",
			runs, wBytes, got)
	}
	truth := onlyTruth(t, log, "")
	m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	if n, _ := metric(t, m, "cudatrace_allocated_bytes_total", "pid", pid); uint64(n) != truth.AllocBytes {
		t.Errorf("the job's allocated bytes: %v, want the stand-in's %d", n, truth.AllocBytes)
	}
	// The agent traces the whole host: a loss elsewhere (another test's
	// burst on a busy machine) is no loss of the job's, whose ledger is
	// exact above; said, not failed on.
	if n, _ := metric(t, m, "cudatrace_lost_events_total"); n != 0 {
		t.Logf("%v events lost on the host while the job ran", n)
	}

	// The maps keyed by process hold the living ones: a few Python
	// processes (the job), and what else runs on this host.
	alive := len(processes(t))
	const slack = 64
	var uses map[string][2]float64
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		uses = map[string][2]float64{}
		for _, s := range samplesOf(m, "cudatrace_bpf_map_entries") {
			c, _ := metric(t, m, "cudatrace_bpf_map_capacity", "map", s.labels["map"])
			uses[s.labels["map"]] = [2]float64{s.value, c}
		}
		if len(uses) > 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, name := range []string{"procs", "pids", "py_procs", "py_threads", "threads", "ctx_stacks", "ctx_inflight"} {
		u, ok := uses[name]
		if !ok {
			t.Errorf("no cudatrace_bpf_map_entries for map %s (have %v)", name, uses)
			continue
		}
		bound := float64(slack)
		if name == "procs" {
			bound += float64(alive) // every process on the host may be noted
		}
		if u[0] > bound {
			t.Errorf("BPF map %s holds %v entries after %d processes ended, want at most %v (%d processes alive)", name, u[0], runs, bound, alive)
		}
		if u[1] == 0 {
			t.Errorf("BPF map %s: capacity 0", name)
		}
	}
	t.Logf("BPF maps after %d processes (entries, capacity): %v; %d processes alive", runs, uses, alive)
}

// processes lists the PIDs running on this host.
func processes(t *testing.T) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
