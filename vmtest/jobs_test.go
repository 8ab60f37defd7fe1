package vmtest

// Distributed jobs (issue 33): processes started with the environments of
// torchrun, Slurm and Open MPI (and a real mpirun), each named by its job
// and rank in report, report --json, pprof, Perfetto and the agent's
// metrics; two "nodes" (two recordings, each in a UTS namespace of its
// own, one with its boot clock moved hours ahead) merged into one trace
// whose report names the rank that ran out first, with its node, time and
// stack, and what every rank held then. Every figure against the
// stand-in's log; every rank's PID from the rank itself (testdata/rankjob.c).
// Privileged.

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/internal/perfettotest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// launcher is the environment a launcher gives rank r (local rank l on
// node g) of a world of w processes, and the job report names it by.
type launcher struct {
	name string
	job  string
	env  func(r, l, g, w int) []string
}

var launchers = []launcher{
	{"torchrun", "torchrun:vmtest-run", func(r, l, g, w int) []string {
		return []string{"RANK=" + strconv.Itoa(r), "LOCAL_RANK=" + strconv.Itoa(l), "WORLD_SIZE=" + strconv.Itoa(w),
			"GROUP_RANK=" + strconv.Itoa(g), "TORCHELASTIC_RUN_ID=vmtest-run", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}
	}},
	{"slurm", "slurm:4242.0", func(r, l, g, w int) []string {
		return []string{"SLURM_JOB_ID=4242", "SLURM_STEP_ID=0", "SLURM_PROCID=" + strconv.Itoa(r), "SLURM_LOCALID=" + strconv.Itoa(l),
			"SLURM_NODEID=" + strconv.Itoa(g), "SLURM_NTASKS=" + strconv.Itoa(w), "SLURM_JOB_NAME=train"}
	}},
	{"openmpi", "mpi:31337", func(r, l, g, w int) []string {
		return []string{"OMPI_COMM_WORLD_RANK=" + strconv.Itoa(r), "OMPI_COMM_WORLD_SIZE=" + strconv.Itoa(w),
			"OMPI_COMM_WORLD_LOCAL_RANK=" + strconv.Itoa(l), "OMPI_MCA_ess_base_jobid=31337", "PMIX_NAMESPACE=31337"}
	}},
}

// ranksScript is a shell line starting rankjob for each of ranks (node g
// of a world of w) with l's environment, in the background, and waiting
// for them all.
func ranksScript(l launcher, dir string, ranks []int, g, w int, fail ...int) string {
	var b strings.Builder
	for i, r := range ranks {
		b.WriteString(strings.Join(l.env(r, i, g, w), " "))
		fmt.Fprintf(&b, " %s %s", workload("rankjob"), dir)
		for _, f := range fail {
			fmt.Fprintf(&b, " %d", f)
		}
		b.WriteString(" & ")
	}
	b.WriteString("wait")
	return b.String()
}

// waitFile waits for dir/name and returns its content.
func waitFile(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			return strings.TrimSpace(string(b))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 40s", path)
		}
	}
}

// waitReady waits for each rank's ready file and returns its PID by rank.
func waitReady(t *testing.T, dir string, ranks []int) map[int]int {
	t.Helper()
	pids := map[int]int{}
	for _, r := range ranks {
		pid, err := strconv.Atoi(waitFile(t, dir, fmt.Sprintf("ready.%d", r)))
		if err != nil {
			t.Fatal(err)
		}
		pids[r] = pid
	}
	return pids
}

func letGo(t *testing.T, dir string, ranks ...int) {
	t.Helper()
	for _, r := range ranks {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("go.%d", r)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The JSON report's jobs and the processes' jobs, as a script reads them.
type jobsReport struct {
	Processes []struct {
		PID     int    `json:"pid"`
		Node    string `json:"node"`
		NodePID int    `json:"node_pid"`
		Live    uint64 `json:"live_bytes"`
		Peak    uint64 `json:"peak_bytes"`
		Job     *struct {
			ID        string `json:"id"`
			Launcher  string `json:"launcher"`
			Rank      *int   `json:"rank"`
			WorldSize int    `json:"world_size"`
		} `json:"job"`
	} `json:"processes"`
	Jobs []struct {
		ID    string   `json:"id"`
		Nodes []string `json:"nodes"`
		Ranks []struct {
			Rank    int    `json:"rank"`
			PID     int    `json:"pid"`
			NodePID int    `json:"node_pid"`
			Node    string `json:"node"`
			Live    uint64 `json:"live_bytes"`
			Peak    uint64 `json:"peak_bytes"`
		} `json:"ranks"`
		Missing      int `json:"missing"`
		FirstFailure *struct {
			Rank    *int          `json:"rank"`
			PID     int           `json:"pid"`
			NodePID int           `json:"node_pid"`
			Node    string        `json:"node"`
			Time    string        `json:"time"`
			Error   string        `json:"error"`
			Frames  []reportFrame `json:"frames"`
			Held    []struct {
				Rank *int   `json:"rank"`
				Node string `json:"node"`
				Live uint64 `json:"live_bytes"`
			} `json:"held"`
		} `json:"first_failure"`
	} `json:"jobs"`
	Nodes []struct {
		Host     string `json:"host"`
		Complete bool   `json:"complete"`
	} `json:"nodes"`
}

func cudatrace(t *testing.T, ctx context.Context, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tracerBin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cudatrace %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

func jobsOf(t *testing.T, ctx context.Context, trace string, args ...string) *jobsReport {
	t.Helper()
	out := cudatrace(t, ctx, append([]string{"report", trace, "--json"}, args...)...)
	var rep jobsReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("report %s --json %s:\n%s", trace, strings.Join(args, " "), truncate(string(out), 32<<10))
		}
	})
	return &rep
}

// TestJobRanks: four ranks, started with each launcher's environment (and
// by a real mpirun), under one record: every one named by its job and
// rank in report (text and JSON), pprof and Perfetto, with its own
// figures.
func TestJobRanks(t *testing.T) {
	cases := append([]launcher{}, launchers...)
	cases = append(cases, launcher{name: "mpirun"}) // its job ID is mpirun's own
	for _, l := range cases {
		t.Run(l.name, func(t *testing.T) {
			ctx, dir := traceSetup(t)
			log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "job.trace")
			ranks := []int{0, 1, 2, 3}
			env := fakeEnv(log)
			var command []string
			if l.env != nil {
				command = []string{"sh", "-c", ranksScript(l, dir, ranks, 0, 4)}
			} else {
				requireTool(t, "mpirun")
				// As root, mpirun wants both of these (or the flag).
				env = append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
				command = []string{"mpirun", "--oversubscribe", "-np", "4", workload("rankjob"), dir}
			}
			rec := startRecord(t, ctx, recordOpts{Env: env}, append([]string{"--lib", fakeLib, "-o", trace, "--"}, command...)...)
			pids := waitReady(t, dir, ranks)
			letGo(t, dir, ranks...)
			rec.finish(t, 50*time.Second)
			truths, err := groundTruthFile(log, "")
			if err != nil {
				t.Fatal(err)
			}
			checkRanks(t, ctx, trace, l, pids, truths)
		})
	}
}

func checkRanks(t *testing.T, ctx context.Context, trace string, l launcher, pids map[int]int, truths map[int]*procTruth) {
	t.Helper()
	rep := jobsOf(t, ctx, trace)
	job := l.job
	byPID := map[int]int{}
	for r, pid := range pids {
		byPID[pid] = r
	}
	for _, p := range rep.Processes {
		r, ok := byPID[p.PID]
		if !ok {
			continue // mpirun's own, had it called CUDA
		}
		if p.Job == nil || p.Job.Rank == nil || *p.Job.Rank != r || p.Job.WorldSize != 4 {
			t.Errorf("pid %d (rank %d): job %+v", p.PID, r, p.Job)
			continue
		}
		if job == "" && strings.HasPrefix(p.Job.ID, "mpi:") && p.Job.Launcher == "openmpi" {
			job = p.Job.ID // mpirun's, the same for every rank
		}
		if p.Job.ID != job {
			t.Errorf("pid %d: job %q, want %q", p.PID, p.Job.ID, job)
		}
		if tr := truths[p.PID]; tr == nil || p.Live != tr.Live || p.Peak != tr.Peak {
			t.Errorf("rank %d: live %d peak %d, ground truth %v", r, p.Live, p.Peak, tr)
		}
	}
	if len(rep.Jobs) != 1 || rep.Jobs[0].ID != job || len(rep.Jobs[0].Ranks) != 4 || rep.Jobs[0].Missing != 0 {
		t.Fatalf("jobs %+v, want %s with 4 ranks", rep.Jobs, job)
	}
	host, _ := os.Hostname()
	for i, rk := range rep.Jobs[0].Ranks {
		tr := truths[rk.PID]
		if rk.Rank != i || rk.PID != pids[i] || rk.Node != host || tr == nil || rk.Live != tr.Live || rk.Peak != tr.Peak {
			t.Errorf("job's rank %d: %+v, want pid %d on %s, ground truth %v", i, rk, pids[i], host, tr)
		}
	}
	// The text groups the job and names it.
	text := string(cudatrace(t, ctx, "report", trace))
	if want := fmt.Sprintf("Job %s", job); !strings.Contains(text, want) || !strings.Contains(text, "RANK") {
		t.Errorf("report lacks %q:\n%s", want, text)
	}
	// --rank picks one.
	if one := jobsOf(t, ctx, trace, "--rank", "2"); len(one.Processes) != 1 || one.Processes[0].PID != pids[2] {
		t.Errorf("--rank 2: %+v", one.Processes)
	}

	// pprof: each sample's job and rank; inuse_space per rank its live.
	dir := t.TempDir()
	pb := filepath.Join(dir, "job.pb.gz")
	cudatrace(t, ctx, "export", trace, "-f", "pprof", "-o", pb)
	f, err := os.Open(pb)
	if err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	inuse := map[string]int64{}
	for _, s := range prof.Sample {
		if got := s.Label["job_id"]; len(got) != 1 || got[0] != job {
			t.Errorf("sample labels %v, want job_id %s", s.Label, job)
		}
		inuse[s.Label["rank"][0]] += s.Value[3] // inuse_space
	}
	for r, pid := range pids {
		if inuse[strconv.Itoa(r)] != int64(truths[pid].Live) {
			t.Errorf("pprof: rank %d inuse_space %d, ground truth %d", r, inuse[strconv.Itoa(r)], truths[pid].Live)
		}
	}
	// Perfetto: a process per rank, titled by rank and PID.
	tl := filepath.Join(dir, "job.json")
	cudatrace(t, ctx, "export", trace, "-f", "perfetto", "-o", tl)
	timeline := checkTimeline(t, tl)
	for r, pid := range pids {
		if want := fmt.Sprintf("rank %d · pid %d", r, pid); timeline.Names[uint32(pid)] != want {
			t.Errorf("perfetto: pid %d is %q, want %q", pid, timeline.Names[uint32(pid)], want)
		}
		if got := timeline.Last[fmt.Sprintf("%d/GPU 0 memory", pid)]; uint64(got) != truths[pid].Live {
			t.Errorf("perfetto: rank %d's GPU 0 track ends at %v, ground truth %d", r, got, truths[pid].Live)
		}
	}
}

// checkTimeline reads the trace-event file at path as a viewer does
// (perfettotest.Check).
func checkTimeline(t *testing.T, path string) perfettotest.Timeline {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return perfettotest.Check(t, data)
}

// TestJobNodes: ranks 0 and 1 recorded as host node-a, ranks 2 and 3 as
// node-b, each record in a UTS namespace of its own; node b's trace then
// has its boot clock moved 3 hours ahead (as if its host had booted
// earlier), its wall clock left as it was. Rank 2 runs out first, then
// rank 1. Merged, the report names rank 2 on node-b, at the time rank 2
// itself read around its call, with its stack, and what each rank held
// then, each figure against the stand-in's log.
func TestJobNodes(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "unshare")
	l := launchers[1] // Slurm's
	log := filepath.Join(dir, "fake.log")
	as := func(host string) []string {
		return []string{"unshare", "--uts", "--", "sh", "-c", `echo "$0" > /proc/sys/kernel/hostname && exec "$@"`, host}
	}
	traces := map[string]string{"node-a": filepath.Join(dir, "a.trace"), "node-b": filepath.Join(dir, "b.trace")}
	ra := startRecord(t, ctx, recordOpts{Env: fakeEnv(log), Wrap: as("node-a")}, "--lib", fakeLib, "-o", traces["node-a"],
		"--", "sh", "-c", ranksScript(l, dir, []int{0, 1}, 0, 4, 1, 2))
	rb := startRecord(t, ctx, recordOpts{Env: fakeEnv(log), Wrap: as("node-b")}, "--lib", fakeLib, "-o", traces["node-b"],
		"--", "sh", "-c", ranksScript(l, dir, []int{2, 3}, 1, 4, 1, 2))
	pids := waitReady(t, dir, []int{0, 1, 2, 3})
	letGo(t, dir, 2)
	oom := strings.Fields(waitFile(t, dir, "oom.2"))
	time.Sleep(50 * time.Millisecond)
	letGo(t, dir, 1)
	waitFile(t, dir, "oom.1")
	letGo(t, dir, 0, 3)
	ra.finish(t, 50*time.Second)
	rb.finish(t, 50*time.Second)

	shifted := filepath.Join(dir, "b-shifted.trace")
	shiftBoot(t, traces["node-b"], shifted, uint64(3*time.Hour))
	merged := filepath.Join(dir, "job.trace")
	cudatrace(t, ctx, "merge", traces["node-a"], shifted, "-o", merged)

	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	truths, err := groundTruth(calls, "")
	if err != nil {
		t.Fatal(err)
	}
	first := -1 // the first failed call in the log: rank 2's
	for i, c := range calls {
		if classOf(c.API) == classAlloc && c.Ret != 0 {
			first = i
			break
		}
	}
	if first < 0 || calls[first].PID != pids[2] {
		t.Fatalf("the log's first failure %+v, want rank 2's (pid %d)", calls[max(first, 0)], pids[2])
	}
	then, err := groundTruth(calls[:first+1], "")
	if err != nil {
		t.Fatal(err)
	}

	rep := jobsOf(t, ctx, merged)
	if len(rep.Nodes) != 2 || rep.Nodes[0].Host != "node-a" || rep.Nodes[1].Host != "node-b" || !rep.Nodes[1].Complete {
		t.Errorf("nodes %+v", rep.Nodes)
	}
	if len(rep.Jobs) != 1 || rep.Jobs[0].ID != l.job || len(rep.Jobs[0].Ranks) != 4 {
		t.Fatalf("jobs %+v", rep.Jobs)
	}
	j := rep.Jobs[0]
	nodeOf := []string{"node-a", "node-a", "node-b", "node-b"}
	for i, rk := range j.Ranks {
		tr := truths[pids[i]]
		if rk.Rank != i || rk.Node != nodeOf[i] || cmpOr(rk.NodePID, rk.PID) != pids[i] || tr == nil || rk.Live != tr.Live || rk.Peak != tr.Peak {
			t.Errorf("rank %d: %+v, want pid %d on %s, ground truth %v", i, rk, pids[i], nodeOf[i], tr)
		}
	}
	f := j.FirstFailure
	if f == nil || f.Rank == nil || *f.Rank != 2 || f.Node != "node-b" || cmpOr(f.NodePID, f.PID) != pids[2] ||
		f.Error != "cudaErrorMemoryAllocation" {
		t.Fatalf("first failure %+v, want rank 2 on node-b", f)
	}
	if !hasFunction(f.Frames, "oom_here") {
		t.Errorf("first failure's stack %+v, want oom_here in it", f.Frames)
	}
	at, err := time.Parse(time.RFC3339Nano, f.Time)
	before, _ := strconv.ParseInt(oom[0], 10, 64)
	after, _ := strconv.ParseInt(oom[1], 10, 64)
	// The call returned between rank 2's two readings of the wall clock;
	// the merged clock is the wall clock, paired with the boot clock
	// within microseconds.
	const slack = time.Millisecond
	if err != nil || at.UnixNano() < before-int64(slack) || at.UnixNano() > after+int64(slack) {
		t.Errorf("first failure at %s, want between %d and %d (rank 2's own readings)", f.Time, before, after)
	}
	if len(f.Held) != 4 {
		t.Fatalf("held %+v", f.Held)
	}
	for i, h := range f.Held {
		want := then[pids[i]].Live
		if h.Rank == nil || *h.Rank != i || h.Node != nodeOf[i] || h.Live != want {
			t.Errorf("held by rank %d at the first failure: %+v, ground truth %d", i, h, want)
		}
	}
	text := string(cudatrace(t, ctx, "report", merged))
	for _, want := range []string{"on 2 nodes (node-a, node-b)",
		fmt.Sprintf("First failure in the job: rank 2 (pid %d) on node-b", pids[2])} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, text)
		}
	}

	// One process per rank in the timeline, titled by rank, node and PID.
	tl := filepath.Join(dir, "job.json")
	cudatrace(t, ctx, "export", merged, "-f", "perfetto", "-o", tl)
	timeline := checkTimeline(t, tl)
	if len(timeline.Names) != 4 {
		t.Errorf("perfetto processes %v, want the 4 ranks", timeline.Names)
	}
	for _, rk := range j.Ranks {
		want := fmt.Sprintf("rank %d · %s · pid %d", rk.Rank, nodeOf[rk.Rank], pids[rk.Rank])
		if got := timeline.Names[uint32(rk.PID)]; got != want {
			t.Errorf("perfetto: pid %d is %q, want %q", rk.PID, got, want)
		}
		if timeline.Sort[uint32(rk.PID)] != rk.Rank {
			t.Errorf("perfetto: rank %d sorts at %d", rk.Rank, timeline.Sort[uint32(rk.PID)])
		}
		if got := timeline.Last[fmt.Sprintf("%d/GPU 0 memory", rk.PID)]; uint64(got) != truths[pids[rk.Rank]].Live {
			t.Errorf("perfetto: rank %d ends at %v, ground truth %d", rk.Rank, got, truths[pids[rk.Rank]].Live)
		}
	}
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func hasFunction(frames []reportFrame, fn string) bool {
	for _, f := range frames {
		if f.Function == fn {
			return true
		}
	}
	return false
}

// shiftBoot copies the trace at in to out with every boot-clock time
// moved by d: the trace its host would have written had it booted d
// earlier. The wall clock at its start is left as it was.
func shiftBoot(t *testing.T, in, out string, d uint64) {
	t.Helper()
	r, err := tracefile.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	meta := r.Meta()
	meta.StartBoot += d
	w, err := tracefile.Create(out, meta)
	if err != nil {
		t.Fatal(err)
	}
	move := func(v *uint64) {
		if *v != 0 {
			*v += d
		}
	}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			raw := append([]byte(nil), rec.Raw...)
			binary.LittleEndian.PutUint64(raw, rec.Event.Time+d) // ts_ns, at 0
			err = w.WriteEvent(raw)
		case tracefile.TypeProcess:
			move(&rec.Process.Time)
			move(&rec.Process.Start)
			err = w.WriteProcess(rec.Process)
		case tracefile.TypeCounters:
			move(&rec.Counters.Time)
			err = w.WriteCounters(rec.Counters)
		case tracefile.TypeEnd:
			move(&rec.End.Time)
			err = w.WriteEnd(rec.End)
		case tracefile.TypeNVML:
			move(&rec.NVML.Time)
			err = w.WriteNVML(rec.NVML)
		case tracefile.TypeAttach:
			move(&rec.Attach.Time)
			err = w.WriteAttach(rec.Attach)
		case tracefile.TypePython:
			err = w.WritePython(rec.Python)
		case tracefile.TypeSymbols:
			err = w.WriteSymbols(rec.Symbols)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestJobAgent: the agent's metrics carry each rank's job and rank, its
// figures the rank's own; a rank's OOM black box is named by job and rank.
func TestJobAgent(t *testing.T) {
	ctx, dir := traceSetup(t)
	dumps := filepath.Join(dir, "oom")
	a := startAgent(t, ctx, "--dump-dir", dumps)
	l := launchers[0] // torchrun's
	log := filepath.Join(dir, "fake.log")
	job := exec.CommandContext(ctx, "sh", "-c", ranksScript(l, dir, []int{0, 1}, 0, 2, 1))
	job.Env = fakeEnv(log)
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { letGo(t, dir, 0, 1); job.Wait() })
	pids := waitReady(t, dir, []int{0, 1})
	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	var samples []sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		samples = parseMetrics(t, get(t, ctx, a.url+"/metrics", 200))
		if len(samplesOf(samples, "cudatrace_peak_bytes", "job_id", l.job)) == 2 || time.Now().After(deadline) {
			break
		}
	}
	for r, pid := range pids {
		p := strconv.Itoa(pid)
		wantMetric(t, samples, truths[pid].Live, "cudatrace_live_bytes", "pid", p, "job_id", l.job, "rank", strconv.Itoa(r),
			"gpu", "0", "level", "segment")
		wantMetric(t, samples, truths[pid].Peak, "cudatrace_peak_bytes", "pid", p, "job_id", l.job, "rank", strconv.Itoa(r),
			"gpu", "0", "level", "segment")
	}
	letGo(t, dir, 1)
	waitFile(t, dir, "oom.1")
	var files []string
	want := filepath.Join(dumps, fmt.Sprintf("oom-torchrun_vmtest-run-rank1-%d-", pids[1]))
	for deadline := time.Now().Add(10 * time.Second); len(files) < 3 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		files, _ = filepath.Glob(want + "*")
	}
	if len(files) != 3 {
		all, _ := filepath.Glob(filepath.Join(dumps, "*"))
		t.Errorf("OOM dump files %v, want three named %s…", all, want)
	}
}

// TestJobEnvironUnreadable: a tracer without CAP_SYS_PTRACE (only BPF,
// PERFMON and KILL) cannot read another user's environment: it says so
// once, on one line, for the two ranks, traces them on, and the report
// says why their job and rank are unknown.
func TestJobEnvironUnreadable(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "setpriv")
	// The ranks run as nobody: they reach the stand-ins (the build's
	// directory is 0700) and write their files and log in dir.
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{buildDir, 0o755}, {filepath.Dir(dir), 0o755}, {dir, 0o777}} {
		if err := os.Chmod(d.path, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "all.trace")
	noPtrace := []string{"setpriv", "--bounding-set", "-all,+bpf,+perfmon,+kill", "--inh-caps", "-all"}
	rec := startRecord(t, ctx, recordOpts{Wrap: noPtrace}, "--all", "--lib", fakeLib, "-o", trace, "--duration", "8s")
	rec.waitAttached(t, 30*time.Second)
	ranks := exec.CommandContext(ctx, "setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
		"sh", "-c", ranksScript(launchers[0], dir, []int{0, 1}, 0, 2))
	ranks.Env = fakeEnv(log)
	if err := ranks.Start(); err != nil {
		t.Fatal(err)
	}
	pids := waitReady(t, dir, []int{0, 1})
	letGo(t, dir, 0, 1)
	if err := ranks.Wait(); err != nil {
		t.Fatalf("the ranks: %v", err)
	}
	rec.finish(t, 30*time.Second)
	stderr := rec.stderr.String()
	if n := strings.Count(stderr, "its job and rank are unknown"); n != 1 ||
		!strings.Contains(stderr, "its environment is not shown to this process (reading another user's process takes CAP_SYS_PTRACE)") {
		t.Errorf("%d warnings of an unreadable environment, want one:\n%s", n, stderr)
	}
	out := cudatrace(t, ctx, "report", trace, "--json")
	var rep struct {
		Processes []struct {
			PID      int             `json:"pid"`
			Allocs   uint64          `json:"allocs"`
			Job      json.RawMessage `json:"job"`
			JobError string          `json:"job_error"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, p := range rep.Processes {
		if p.PID != pids[0] && p.PID != pids[1] {
			continue // --all: others on the host
		}
		seen++
		if p.Job != nil || !strings.Contains(p.JobError, "its job and rank are unknown") || p.Allocs != 3 {
			t.Errorf("pid %d: job %s, job_error %q, %d allocations (want 3)", p.PID, p.Job, p.JobError, p.Allocs)
		}
	}
	if seen != 2 {
		t.Errorf("%d of the ranks in the report, want 2:\n%s", seen, out)
	}
}
