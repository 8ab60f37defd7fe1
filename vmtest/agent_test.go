package vmtest

// End-to-end tests of `cudatrace agent`: the built binary serves on a free
// loopback port, stand-in jobs (testdata/agentload.c) start after it, and
// what it serves is checked against the stand-in's ground truth.
// Privileged.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// runningAgent is a `cudatrace agent` under test.
type runningAgent struct {
	cmd    *exec.Cmd
	url    string // http://127.0.0.1:PORT
	stderr *lockedBuffer
	done   chan struct{}
	err    error
}

var servingRE = regexp.MustCompile(`cudatrace agent: serving (http://[0-9.:]+)/`)

// startAgent starts the agent on a free loopback port with the stand-in
// library and waits until it serves and has attached.
func startAgent(t *testing.T, ctx context.Context, args ...string) *runningAgent {
	t.Helper()
	return startAgentArgs(t, ctx, append([]string{"--lib", fakeLib}, args...)...)
}

// startAgentArgs starts the agent with args only (no --lib).
func startAgentArgs(t *testing.T, ctx context.Context, args ...string) *runningAgent {
	t.Helper()
	return startAgentEnv(t, ctx, nil, args...)
}

// startAgentEnv starts the agent with env added to this process's.
func startAgentEnv(t *testing.T, ctx context.Context, env []string, args ...string) *runningAgent {
	t.Helper()
	return startAgentWrapped(t, ctx, nil, env, args...)
}

// startAgentWrapped starts the agent under wrap (argv, cudatrace's after
// it; nil: none), with env added to this process's.
func startAgentWrapped(t *testing.T, ctx context.Context, wrap, env []string, args ...string) *runningAgent {
	t.Helper()
	argv := append(append(append([]string{}, wrap...), tracerBin, "agent", "--listen", "127.0.0.1:0"), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	a := &runningAgent{cmd: cmd, stderr: newLockedBuffer(attachedLine), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = a.stderr, a.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd, err)
	}
	go func() { a.err = cmd.Wait(); close(a.done) }()
	t.Cleanup(func() {
		select {
		case <-a.done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-a.done
		}
		if t.Failed() {
			t.Logf("%s\nexit: %v\noutput:\n%s", cmd, a.err, truncate(a.stderr.String(), 16<<10))
		}
	})
	select {
	case <-a.stderr.seen:
	case <-a.done:
		t.Fatalf("cudatrace agent exited (%v):\n%s", a.err, a.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("cudatrace agent did not attach within 30s:\n%s", a.stderr.String())
	}
	m := servingRE.FindStringSubmatch(a.stderr.String())
	if m == nil {
		t.Fatalf("cudatrace agent did not say where it serves:\n%s", a.stderr.String())
	}
	a.url = m[1]
	return a
}

// stop sends SIGTERM and requires a clean exit.
func (a *runningAgent) stop(t *testing.T) {
	t.Helper()
	a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		// What it is waiting on: each thread's kernel stack, the
		// processes stopped or in uninterruptible sleep, and (SIGQUIT)
		// its goroutines, in the output logged at cleanup.
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", a.cmd.Process.Pid))
		for _, task := range tasks {
			stack, _ := os.ReadFile(task + "/stack")
			stat, _ := os.ReadFile(task + "/stat")
			t.Logf("%s: %s%s", task, stat, stack)
		}
		ps, _ := exec.Command("ps", "-eo", "pid,ppid,stat,wchan:30,args").CombinedOutput()
		for _, l := range strings.Split(string(ps), "\n") {
			if f := strings.Fields(l); len(f) > 2 && (strings.HasPrefix(f[2], "T") || strings.HasPrefix(f[2], "D")) {
				t.Logf("stopped or waiting: %s", l)
			}
		}
		a.cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(3 * time.Second)
		t.Fatal("cudatrace agent did not stop within 20s of SIGTERM")
	}
	if a.err != nil {
		t.Errorf("cudatrace agent exited with %v", a.err)
	}
	if !strings.Contains(a.stderr.String(), "cudatrace agent: stopped") {
		t.Errorf("cudatrace agent did not say it stopped")
	}
}

// get fetches url and requires want as the status.
func get(t *testing.T, ctx context.Context, url string, want int, header ...string) []byte {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %s, want %d\n%s", url, resp.Status, want, truncate(string(body), 4096))
	}
	return body
}

// job is a running test program (agentload, or a Python script of
// testdata) that says "ready", then answers each line of stdin with one
// line.
type job struct {
	name string // for messages
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	pid  int
}

func startJob(t *testing.T, ctx context.Context, log string, env ...string) *job {
	t.Helper()
	cmd := exec.CommandContext(ctx, workload("agentload"))
	cmd.Env = fakeEnv(log, env...)
	return startCmdJob(t, "agentload", cmd)
}

// startCmdJob starts cmd with pipes for stdin and stdout, and waits for it
// to say "ready". Its stderr is logged if the test fails.
func startCmdJob(t *testing.T, name string, cmd *exec.Cmd) *job {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	j := &job{name: name, cmd: cmd, in: in, out: bufio.NewScanner(out), pid: cmd.Process.Pid}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
		if t.Failed() && stderr.String() != "" {
			t.Logf("%s %d stderr: %s", name, j.pid, stderr.String())
		}
	})
	if !j.out.Scan() || j.out.Text() != "ready" {
		t.Fatalf("%s said %q (%v), want ready; stderr: %s", name, j.out.Text(), j.out.Err(), stderr.String())
	}
	return j
}

func (j *job) reply(t *testing.T) string {
	t.Helper()
	if !j.out.Scan() {
		t.Fatalf("%s %d ended its output: %v", j.name, j.pid, j.out.Err())
	}
	return j.out.Text()
}

// do sends one command and requires the reply.
func (j *job) do(t *testing.T, want string, format string, args ...any) {
	t.Helper()
	cmd := fmt.Sprintf(format, args...)
	if _, err := fmt.Fprintln(j.in, cmd); err != nil {
		t.Fatalf("%s %d: %s: %v", j.name, j.pid, cmd, err)
	}
	if r := j.reply(t); r != want {
		t.Fatalf("%s %d: %s answered %q, want %q", j.name, j.pid, cmd, r, want)
	}
}

// end closes the job's input: it exits, holding what it holds.
func (j *job) end(t *testing.T) {
	t.Helper()
	j.in.Close()
	if err := j.cmd.Wait(); err != nil {
		t.Fatalf("agentload %d: %v", j.pid, err)
	}
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func parseMetrics(t *testing.T, text []byte) []sample {
	t.Helper()
	var out []sample
	for _, line := range strings.Split(string(text), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		s := sample{labels: map[string]string{}, value: v}
		head := line[:i]
		if j := strings.IndexByte(head, '{'); j >= 0 {
			s.name = head[:j]
			for _, m := range labelRE.FindAllStringSubmatch(head[j:], -1) {
				s.labels[m[1]] = m[2]
			}
		} else {
			s.name = head
		}
		out = append(out, s)
	}
	return out
}

// metric finds the one sample of name with labels (a subset); ok is false
// when there is none.
func metric(t *testing.T, samples []sample, name string, labels ...string) (float64, bool) {
	t.Helper()
	found := samplesOf(samples, name, labels...)
	if len(found) > 1 {
		t.Fatalf("%s%v: %d samples, want one", name, labels, len(found))
	}
	if len(found) == 0 {
		return 0, false
	}
	return found[0].value, true
}

// samplesOf returns the samples of name with the labels given (name,
// value pairs).
func samplesOf(samples []sample, name string, labels ...string) []sample {
	var found []sample
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if s.labels[labels[i]] != labels[i+1] {
				continue next
			}
		}
		found = append(found, s)
	}
	return found
}

func wantMetric(t *testing.T, samples []sample, want uint64, name string, labels ...string) {
	t.Helper()
	v, ok := metric(t, samples, name, labels...)
	if !ok {
		// The series of that name that share the first label, if any:
		// what the metric was found under instead (another comm, job,
		// rank).
		if len(labels) < 2 {
			t.Errorf("%s%v: missing", name, labels)
			return
		}
		var near []string
		for _, s := range samplesOf(samples, name, labels[:2]...) {
			near = append(near, fmt.Sprintf("%v = %v", s.labels, s.value))
		}
		t.Errorf("%s%v: missing; the series of %s=%s: %v", name, labels, labels[0], labels[1], near)
		return
	}
	if v != float64(want) {
		t.Errorf("%s%v = %v, want %d", name, labels, v, want)
	}
}

// topFunction is a pprof sample's innermost function name.
func topFunction(s *profile.Sample) string {
	if len(s.Location) == 0 || len(s.Location[0].Line) == 0 {
		return ""
	}
	return s.Location[0].Line[0].Function.Name
}

// byTop sums a profile's values by innermost function.
func byTop(p *profile.Profile) map[string][4]int64 {
	out := map[string][4]int64{}
	for _, s := range p.Sample {
		v := out[topFunction(s)]
		for i := range v {
			v[i] += s.Value[i]
		}
		out[topFunction(s)] = v
	}
	return out
}

func fetchProfile(t *testing.T, ctx context.Context, url string) *profile.Profile {
	t.Helper()
	p, err := profile.ParseData(get(t, ctx, url, http.StatusOK))
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return p
}

// TestAgent: jobs started after the agent; its metrics equal the ground
// truth, its profile and snapshot show the live set by stack, a trace
// window reads back, an OOM leaves its black box, and an exited job ages
// out.
func TestAgent(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log, dumps := filepath.Join(dir, "fake.log"), filepath.Join(dir, "oom")
	const retention = 3 * time.Second
	ag := startAgent(t, ctx, "--dump-dir", dumps, "--retention", retention.String())

	a := startJob(t, ctx, log)
	a.do(t, "ok", "weights %d 0", 1000000)
	a.do(t, "ok", "weights %d 1", 3000000)
	a.do(t, "ok", "step %d", 5000)
	b := startJob(t, ctx, log)
	b.do(t, "ok", "weights %d 0", 777)
	b.do(t, "oom", "grow %d", 2*fakeMemLimit)

	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	ta, tb := truths[a.pid], truths[b.pid]
	if ta == nil || tb == nil || len(truths) != 2 {
		t.Fatalf("ground truth has pids %v, want %d and %d", keys(truths), a.pid, b.pid)
	}

	t.Run("metrics", func(t *testing.T) {
		m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		for _, tr := range []*procTruth{ta, tb} {
			pid := strconv.Itoa(tr.PID)
			for d, dt := range tr.Devices {
				gpu := strconv.Itoa(d)
				wantMetric(t, m, dt.Live, "cudatrace_live_bytes", "pid", pid, "gpu", gpu, "level", "segment")
				wantMetric(t, m, dt.Peak, "cudatrace_peak_bytes", "pid", pid, "gpu", gpu, "level", "segment")
			}
			wantMetric(t, m, tr.Allocs, "cudatrace_allocations_total", "pid", pid, "level", "segment")
			wantMetric(t, m, tr.Failed, "cudatrace_allocation_failures_total", "pid", pid)
			wantMetric(t, m, tr.AllocBytes, "cudatrace_allocated_bytes_total", "pid", pid)
			wantMetric(t, m, tr.HostLive, "cudatrace_host_live_bytes", "pid", pid, "comm", "agentload", "container_id", "", "pod_uid", "")
		}
		wantMetric(t, m, 0, "cudatrace_oom_total", "pid", strconv.Itoa(a.pid))
		wantMetric(t, m, 1, "cudatrace_oom_total", "pid", strconv.Itoa(b.pid))
		wantMetric(t, m, 0, "cudatrace_lost_events_total")
		if v, _ := metric(t, m, "cudatrace_processes"); v < 2 {
			t.Errorf("cudatrace_processes = %v, want at least 2", v)
		}
		if _, ok := metric(t, m, "cudatrace_build_info"); !ok {
			t.Error("cudatrace_build_info missing")
		}
	})

	t.Run("pprof", func(t *testing.T) {
		url := fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, a.pid)
		p := fetchProfile(t, ctx, url)
		if p.DefaultSampleType != "inuse_space" || len(p.SampleType) != 12 || p.SampleType[3].Type != "inuse_space" {
			t.Fatalf("sample types %v, default %q", p.SampleType, p.DefaultSampleType)
		}
		got := byTop(p)
		// First scrape: alloc_* is everything since the start.
		if v := got["load_weights"]; v != [4]int64{2, 4000000, 2, 4000000} {
			t.Errorf("load_weights: %v, want [2 4000000 2 4000000]", v)
		}
		if v := got["train_step"]; v != [4]int64{1, 5000, 0, 0} {
			t.Errorf("train_step: %v, want [1 5000 0 0]", v)
		}
		for _, s := range p.Sample {
			if s.NumLabel["pid"][0] != int64(a.pid) || s.Label["comm"][0] != "agentload" {
				t.Errorf("sample labels %v %v", s.Label, s.NumLabel)
			}
		}
		// The next scrape: alloc_* is what came since, nothing.
		a.do(t, "ok", "step %d", 6000)
		got = byTop(fetchProfile(t, ctx, url))
		if v := got["load_weights"]; v != [4]int64{0, 0, 2, 4000000} {
			t.Errorf("second scrape, load_weights: %v, want [0 0 2 4000000]", v)
		}
		if v := got["train_step"]; v != [4]int64{1, 6000, 0, 0} {
			t.Errorf("second scrape, train_step: %v, want [1 6000 0 0]", v)
		}
		// go tool pprof reads it straight from the agent.
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
		}
		out, err := exec.CommandContext(ctx, goTool, "tool", "pprof", "-raw", ag.url+"/debug/pprof/cuda_memory").CombinedOutput()
		if err != nil {
			t.Fatalf("go tool pprof -raw: %v\n%s", err, out)
		}
		for _, want := range []string{"load_weights", "inuse_space/bytes", "agentload.c"} {
			if !bytes.Contains(out, []byte(want)) {
				t.Errorf("go tool pprof -raw: no %q in\n%s", want, truncate(string(out), 4096))
			}
		}
		if !bytes.Contains(out, []byte(fmt.Sprintf("pid:[%d]", b.pid))) {
			t.Errorf("go tool pprof -raw: no sample of pid %d (all processes) in\n%s", b.pid, truncate(string(out), 4096))
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		body := get(t, ctx, fmt.Sprintf("%s/snapshot?pid=%d", ag.url, a.pid), http.StatusOK)
		if len(body) < 2 || body[0] != 0x80 {
			t.Fatalf("not a pickle: % x", body[:min(len(body), 16)])
		}
		for _, want := range []string{"segments", "device_traces", "load_weights", "active_allocated"} {
			if !bytes.Contains(body, []byte(want)) {
				t.Errorf("snapshot: no %q", want)
			}
		}
		checkPickleSegments(t, ctx, body, 2, 4000000)
		get(t, ctx, ag.url+"/snapshot", http.StatusBadRequest)
		get(t, ctx, ag.url+"/snapshot?pid=999999999", http.StatusNotFound)
	})

	t.Run("oom dump", func(t *testing.T) {
		var files []string
		for deadline := time.Now().Add(10 * time.Second); ; {
			files, _ = filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-%d-*", b.pid)))
			if len(files) == 3 || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if len(files) != 3 {
			t.Fatalf("dump files for pid %d: %v, want 3", b.pid, files)
		}
		if others, _ := filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-%d-*", a.pid))); len(others) != 0 {
			t.Errorf("pid %d never failed, but has dumps %v", a.pid, others)
		}
		for _, f := range files {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: mode %v, want 0600", f, fi.Mode().Perm())
			}
			data, _ := os.ReadFile(f)
			switch filepath.Ext(f) {
			case ".json":
				var rep struct {
					PID     int `json:"pid"`
					Failure struct {
						API             string        `json:"api"`
						Size            uint64        `json:"size"`
						Error           string        `json:"error"`
						Frames          []reportFrame `json:"frames"`
						DeviceLiveBytes uint64        `json:"device_live_bytes"`
					} `json:"failure"`
				}
				if err := json.Unmarshal(data, &rep); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				fl := rep.Failure
				if rep.PID != b.pid || fl.API != "cudaMalloc" || fl.Size != 2*fakeMemLimit ||
					fl.Error != "cudaErrorMemoryAllocation" || fl.DeviceLiveBytes != 777 {
					t.Errorf("%s: %+v", f, rep)
				}
				if len(fl.Frames) < 2 || fl.Frames[0].Function != "grow_activations" || fl.Frames[1].Function != "main" {
					t.Errorf("%s: failing stack %+v, want grow_activations <- main", f, fl.Frames)
				}
			case ".gz":
				p, err := profile.ParseData(data)
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				if v := byTop(p)["load_weights"]; v[3] != 777 || len(p.Sample) != 1 {
					t.Errorf("%s: live set %v, want 777 bytes from load_weights only", f, byTop(p))
				}
			case ".pickle":
				if !bytes.Contains(data, []byte("grow_activations")) || !bytes.Contains(data, []byte("oom")) {
					t.Errorf("%s: no oom entry from grow_activations", f)
				}
				checkPickleSegments(t, ctx, data, 1, 777)
			}
		}
	})

	t.Run("trace window", func(t *testing.T) {
		trace := filepath.Join(dir, "window.trace")
		traceWindow(t, ag.url, a.pid, 3, trace, func() {
			a.do(t, "ok", "step %d", 4096)
			a.do(t, "ok", "weights %d 1", 2048)
			b.do(t, "ok", "weights %d 0", 1) // another process: not in the window
		})
		rep := runReport(t, ctx, trace)
		if len(rep.Processes) != 1 {
			t.Fatalf("the window has %d processes, want pid %d only", len(rep.Processes), a.pid)
		}
		p := rep.Processes[0]
		// The window starts with what the process held (its weights,
		// 1000000 + 3000000 bytes): live, but not allocated in it.
		if p.PID != a.pid || p.Allocs != 2 || p.Frees != 1 || p.AllocBytes != 4096+2048 || p.BeforeBytes != 4000000 ||
			p.LiveBytes != 4000000+2048 || rep.LostEvents != 0 {
			t.Errorf("window: %+v (lost %d), want pid %d: 2 allocs, 1 free, 6144 allocated, 4000000 from before, 4002048 live",
				p, rep.LostEvents, a.pid)
		}
		checkStacks(t, rep, a.pid, workload("agentload"), "train_step", "main")
		// The window starts after the process's memory exists: its
		// memviz export must still be one memory_viz can walk.
		checkMemvizExport(t, ctx, trace, a.pid)
	})

	t.Run("exited jobs age out", func(t *testing.T) {
		a.end(t)
		pid := strconv.Itoa(a.pid)
		waitFor := func(cond func() bool, within time.Duration, what string) {
			t.Helper()
			for deadline := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
				if cond() {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("pid %s: %s within %v", pid, what, within)
				}
			}
		}
		waitFor(func() bool {
			m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
			_, ok := metric(t, m, "cudatrace_live_bytes", "pid", pid, "gpu", "0")
			return !ok
		}, 5*time.Second, "still in the metrics after it exited")
		// Its account stays for the retention, then goes.
		get(t, ctx, fmt.Sprintf("%s/snapshot?pid=%s", ag.url, pid), http.StatusOK)
		waitFor(func() bool {
			resp, err := http.Get(fmt.Sprintf("%s/snapshot?pid=%s", ag.url, pid))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusNotFound
		}, retention+5*time.Second, "still has an account after the retention")
		m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		wantMetric(t, m, 777+1, "cudatrace_live_bytes", "pid", strconv.Itoa(b.pid), "gpu", "0", "level", "segment")
	})
	b.end(t)
	ag.stop(t)
}

// checkPickleSegments loads a memory snapshot with Python's pickle, when
// there is a python3, and checks its segments.
func checkPickleSegments(t *testing.T, ctx context.Context, data []byte, n int, total uint64) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		return // the byte checks above stand
	}
	f := filepath.Join(t.TempDir(), "agent.pickle")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	memviztest.Check(t, f, memviztest.Want{})
	cmd := exec.CommandContext(ctx, py, "-c",
		"import pickle,sys; d=pickle.load(sys.stdin.buffer); print(len(d['segments']), sum(s['total_size'] for s in d['segments']))")
	cmd.Stdin = bytes.NewReader(data)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 pickle.load: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), fmt.Sprintf("%d %d", n, total); got != want {
		t.Errorf("snapshot segments and bytes: %s, want %s", got, want)
	}
}

// TestAgentToken: off loopback the agent wants a token; with one, requests
// without it are refused.
func TestAgentToken(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	dir := t.TempDir()
	out, err := exec.CommandContext(ctx, tracerBin, "agent", "--listen", "0.0.0.0:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a loopback address") || !strings.Contains(string(out), "--token-file") {
		t.Errorf("agent --listen 0.0.0.0:0 without a token: %v\n%s", err, out)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ag := startAgent(t, ctx, "--token-file", token, "--dump-dir", "")
	get(t, ctx, ag.url+"/metrics", http.StatusUnauthorized)
	get(t, ctx, ag.url+"/metrics", http.StatusUnauthorized, "Authorization", "Bearer wrong")
	body := get(t, ctx, ag.url+"/metrics", http.StatusOK, "Authorization", "Bearer s3cret")
	if !bytes.Contains(body, []byte("cudatrace_build_info")) {
		t.Errorf("metrics with the token: no cudatrace_build_info")
	}
	ag.stop(t)
}

// freePort returns a loopback port nobody listens on (now).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestAgentPrometheus: a real Prometheus (Debian's) scrapes the agent on
// loopback, and its query API returns the job's live bytes.
func TestAgentPrometheus(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "prometheus")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log := filepath.Join(dir, "fake.log")
	ag := startAgent(t, ctx, "--dump-dir", "")
	j := startJob(t, ctx, log)
	j.do(t, "ok", "weights %d 1", 123456789)
	j.do(t, "ok", "weights %d 1", 1000)
	want := onlyTruth(t, log, "").Devices[1].Live

	prom := startPrometheus(t, ctx, dir, strings.TrimPrefix(ag.url, "http://"), "")
	query := fmt.Sprintf(`cudatrace_live_bytes{job="cudatrace",pid="%d",gpu="1",level="segment"}`, j.pid)
	api := prom + "/api/v1/query?query=" + url.QueryEscape(query)
	var last string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		resp, err := http.Get(api)
		if err != nil {
			last = err.Error()
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(body)
		var r struct {
			Status string `json:"status"`
			Data   struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Value  [2]any            `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.Unmarshal(body, &r) != nil || r.Status != "success" || len(r.Data.Result) == 0 {
			continue
		}
		if len(r.Data.Result) != 1 {
			t.Fatalf("%s: %d series, want 1: %s", query, len(r.Data.Result), body)
		}
		got, _ := r.Data.Result[0].Value[1].(string)
		if got != strconv.FormatUint(want, 10) {
			t.Fatalf("Prometheus says %s = %s, want %d (the stand-in's ground truth)", query, got, want)
		}
		if c := r.Data.Result[0].Metric["comm"]; c != "agentload" {
			t.Errorf("comm label %q, want agentload", c)
		}
		j.end(t)
		ag.stop(t)
		return
	}
	t.Fatalf("Prometheus never returned %s within 60s; last answer: %s", query, last)
}

// TestAgentContainer: a job in a pod's container cgroup (made here, named
// as the kubelet and containerd name them) is labelled with the container
// ID and pod UID.
func TestAgentContainer(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	const (
		pod = "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
		id  = "3f4e1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	)
	parent := kubepods(t, "kubepods-cudatrace-test")
	dir := podCgroup(t, parent, pod, id)
	ag := startAgent(t, ctx, "--dump-dir", "")
	j := startJob(t, ctx, filepath.Join(t.TempDir(), "fake.log"))
	moveTo(t, dir, j.pid)
	// A trace window from its first call on: its process frame, written by
	// the recorder's capture, names the container too.
	type result struct {
		body []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Get(ag.url + "/trace?seconds=2")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{b, err}
	}()
	time.Sleep(500 * time.Millisecond)
	j.do(t, "ok", "weights %d 0", 4096)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	trace := filepath.Join(t.TempDir(), "c.trace")
	if err := os.WriteFile(trace, r.body, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", "--json", trace).Output()
	if err != nil {
		t.Fatalf("cudatrace report: %v", err)
	}
	var rep struct {
		Processes []struct {
			PID       int    `json:"pid"`
			Container string `json:"container"`
			PodUID    string `json:"pod_uid"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range rep.Processes {
		if p.PID == j.pid {
			found = true
			if p.Container != id || p.PodUID != pod {
				t.Errorf("report of the window: pid %d in container %q pod %q, want %s, %s", p.PID, p.Container, p.PodUID, id, pod)
			}
		}
	}
	if !found {
		t.Errorf("report of the window has no pid %d:\n%s", j.pid, out)
	}
	m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	wantMetric(t, m, 4096, "cudatrace_live_bytes", "pid", strconv.Itoa(j.pid), "gpu", "0", "level", "segment",
		"container_id", id, "pod_uid", pod)
	p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, j.pid))
	if len(p.Sample) != 1 || p.Sample[0].Label["container_id"][0] != id || p.Sample[0].Label["pod_uid"][0] != pod {
		t.Errorf("profile labels: %v", p.Sample)
	}
	j.end(t)
	ag.stop(t)
}

// cgroupBase is a cgroup hierarchy the test may make cgroups in: the
// unified (v2) one, or v1's pids hierarchy on a host with v1 only.
func cgroupBase(t *testing.T) string {
	t.Helper()
	for _, d := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids"} {
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			return d
		}
	}
	skipOrFail(t, "no cgroup hierarchy mounted under /sys/fs/cgroup")
	return ""
}

// TestAgentLateLibrary: without --lib, a copy of the runtime that appears
// after the agent started (a new virtualenv's wheel) is found in the
// process that maps it and attached; the process's calls from then on are
// traced.
func TestAgentLateLibrary(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	dir := t.TempDir()
	ag := startAgentArgs(t, ctx, "--dump-dir", "")
	// The copy is made after the agent's start-up search: a new file.
	lib := wheelCopy(t, filepath.Join(dir, "venv", "lib", "python3.12", "site-packages"))
	wheel := filepath.Dir(lib)
	// LD_LIBRARY_PATH wins over the workload's RUNPATH: it loads the copy.
	log := filepath.Join(dir, "fake.log")
	j := startJob(t, ctx, log, "LD_LIBRARY_PATH="+wheel)
	maps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/maps", j.pid))
	if !bytes.Contains(maps, []byte(lib)) {
		t.Fatalf("agentload did not load %s:\n%s", lib, maps)
	}
	want := fmt.Sprintf("cudatrace: pid %d loaded %s after tracing began", j.pid, lib)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(ag.stderr.String(), want); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not attach %s within 15s", lib)
		}
	}
	j.do(t, "ok", "weights %d 1", 65536)
	j.do(t, "ok", "step %d", 512)
	truth := onlyTruth(t, log, "")
	m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	pid := strconv.Itoa(j.pid)
	wantMetric(t, m, truth.Devices[1].Live, "cudatrace_live_bytes", "pid", pid, "gpu", "1", "level", "segment")
	wantMetric(t, m, truth.Allocs, "cudatrace_allocations_total", "pid", pid, "level", "segment")
	j.end(t)
	ag.stop(t)
}

// TestAgentNVML: with NVML's stand-in, the driver's figures per device and
// per process are exported beside the traced ones, labelled alike, and the
// traced metrics get the device's UUID.
func TestAgentNVML(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx := testContext(t)
	dir := t.TempDir()
	procs := filepath.Join(dir, "nvml-procs")
	ag := startAgentEnv(t, ctx, []string{"LD_LIBRARY_PATH=" + fakeNVMLDir, "FAKENVML_PROCS=" + procs},
		"--lib", fakeLib, "--dump-dir", "")
	j := startJob(t, ctx, filepath.Join(dir, "fake.log"))
	j.do(t, "ok", "weights %d 1", 5000000)
	// The driver charges the job its allocation and 300 MiB of context.
	const driverOwn = 300 << 20
	if err := os.WriteFile(procs, []byte(fmt.Sprintf("%d 1 %d\n", j.pid, 5000000+driverOwn)), 0o644); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(j.pid)
	// A sample's device and process figures are separate NVML calls, as
	// with the real library, and the stand-in reads the file at each: one
	// sample may take the device's before the file was written and the
	// process's after. Both must be there.
	var m []sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		v, ok := metric(t, m, "cudatrace_nvml_process_used_bytes", "pid", pid)
		dev, devOK := metric(t, m, "cudatrace_nvml_used_bytes", "gpu", "1")
		if ok && v == 5000000+driverOwn && devOK && dev == 5000000+driverOwn {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cudatrace_nvml_process_used_bytes for pid %s and cudatrace_nvml_used_bytes for gpu 1 within 10s (%v %v, %v %v)",
				pid, v, ok, dev, devOK)
		}
	}
	wantMetric(t, m, 1, "cudatrace_nvml_up")
	wantMetric(t, m, 5000000+driverOwn, "cudatrace_nvml_process_used_bytes", "pid", pid, "gpu", "1", "UUID", "GPU-fake-1",
		"comm", "agentload")
	wantMetric(t, m, 5000000+driverOwn, "cudatrace_nvml_used_bytes", "gpu", "1", "UUID", "GPU-fake-1")
	wantMetric(t, m, 16<<30, "cudatrace_nvml_total_bytes", "gpu", "0", "UUID", "GPU-fake-0")
	wantMetric(t, m, 5000000, "cudatrace_live_bytes", "pid", pid, "gpu", "1", "UUID", "GPU-fake-1", "level", "segment")
	j.end(t)
	ag.stop(t)
}

// traceWindow asks the agent at url for pid's (0: every process's)
// /trace window of seconds, runs steps while it is open, and writes what
// came back to path.
func traceWindow(t *testing.T, url string, pid, seconds int, path string, steps func()) {
	t.Helper()
	type result struct {
		body []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		q := fmt.Sprintf("seconds=%d", seconds)
		if pid != 0 {
			q += fmt.Sprintf("&pid=%d", pid)
		}
		resp, err := http.Get(url + "/trace?" + q)
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("%s: %s", resp.Status, body)
		}
		got <- result{body, err}
	}()
	time.Sleep(time.Second) // the window is open
	steps()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := os.WriteFile(path, r.body, 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkMemvizExport exports pid's memviz snapshot of the trace with the
// cudatrace under test and checks it as memory_viz reads it.
func checkMemvizExport(t *testing.T, ctx context.Context, trace string, pid int) {
	t.Helper()
	snap := filepath.Join(t.TempDir(), "snap.pickle")
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "-f", "memviz", "--pid", strconv.Itoa(pid),
		"-o", snap).CombinedOutput(); err != nil {
		t.Fatalf("export memviz: %v\n%s", err, out)
	}
	memviztest.Check(t, snap, memviztest.Want{})
}
