package vmtest

// cudatrace must never harm what it watches, never lose a recording, never
// hand a node's secrets to another local user (issue 20). Privileged.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// procState is the state letter of /proc/PID/stat ('T': stopped), or 0
// when the process is gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// waitFor polls cond every 5 ms until it holds or timeout passes, and
// says how long it took.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runCLI runs cudatrace ARGS to its end (30 s at most) and returns its
// output and exit status.
func runCLI(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(testContext(t), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, tracerBin, args...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("cudatrace %s: %v", strings.Join(args, " "), err)
	}
	if ctx.Err() != nil {
		t.Fatalf("cudatrace %s: still running after 30 s", strings.Join(args, " "))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cudatrace %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), cmd.ProcessState.ExitCode(),
				truncate(o.String(), 4<<10), truncate(e.String(), 4<<10))
		}
	})
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// oneLineError checks a refusal: exit 1, a short message naming what, no
// Go stack trace.
func oneLineError(t *testing.T, stderr string, code int, what ...string) {
	t.Helper()
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if strings.Contains(stderr, "goroutine ") || strings.Count(strings.TrimSpace(stderr), "\n") > 1 {
		t.Errorf("want one error line and a hint, got:\n%s", stderr)
	}
	for _, w := range what {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr does not say %q:\n%s", w, stderr)
		}
	}
}

// TestOutputsRefused: outputs that are not regular files are refused before
// anything is traced (the command never runs, no probe is attached) and
// left as they were: a FIFO and a link to one for -o and --export, and an
// --export into a directory that does not exist. `export -o` refuses them
// too.
func TestOutputsRefused(t *testing.T) {
	_, dir := traceSetup(t)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(fifo, link); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "ran")
	cmd := []string{"--", "sh", "-c", "touch " + marker}
	for _, c := range []struct {
		name string
		args []string
		want []string
	}{
		{"TraceFIFO", []string{"-o", fifo}, []string{fifo, "is a FIFO"}},
		{"TraceLinkToFIFO", []string{"-o", link}, []string{link, "is a FIFO"}},
		{"ExportFIFO", []string{"--export", "pprof=" + fifo}, []string{fifo, "is a FIFO"}},
		{"ExportLinkToFIFO", []string{"--export", "json=" + link}, []string{link, "is a FIFO"}},
		{"ExportNoDir", []string{"-o", filepath.Join(dir, "t.trace"), "--export", "pprof=" + filepath.Join(dir, "no", "such", "p.pb.gz")},
			[]string{"p.pb.gz", "no such file or directory"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(append([]string{"record", "--lib", fakeLib}, c.args...), cmd...)
			_, stderr, code := runCLI(t, nil, args...)
			oneLineError(t, stderr, code, c.want...)
			if strings.Contains(stderr, attachedLine) {
				t.Errorf("probes were attached before the output was refused")
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the command ran before the output was refused")
			}
		})
	}
	t.Run("Export", func(t *testing.T) {
		trace := filepath.Join(dir, "t.trace")
		if _, _, code := runCLI(t, fakeEnv(""), "record", "-q", "--lib", fakeLib, "-o", trace, "--", workload("mix"), "1", "20", "1"); code != 0 {
			t.Fatalf("record exited %d", code)
		}
		for _, out := range []string{fifo, link} {
			_, stderr, code := runCLI(t, nil, "export", trace, "--format", "pprof", "-o", out)
			oneLineError(t, stderr, code, out, "is a FIFO")
		}
	})
	for _, p := range []string{fifo, link} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeSymlink) == 0 {
			t.Errorf("%s is no longer what it was: %v %v", p, fi.Mode(), err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 3 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("%s holds %v, want fifo, link and t.trace", dir, names)
	}
}

// TestOutputModes: a trace and an export are created 0600 (they hold
// command lines and stacks); an export through a link writes the file it
// names and keeps that file's mode.
func TestOutputModes(t *testing.T) {
	_, dir := traceSetup(t)
	trace, pb, js := filepath.Join(dir, "t.trace"), filepath.Join(dir, "t.pb.gz"), filepath.Join(dir, "t.json")
	kept := filepath.Join(dir, "kept.json")
	if err := os.WriteFile(kept, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(kept, 0o640)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink("kept.json", link); err != nil {
		t.Fatal(err)
	}
	if _, _, code := runCLI(t, fakeEnv(""), "record", "-q", "--lib", fakeLib, "-o", trace,
		"--export", "pprof="+pb, "--export", "json="+link, "--", workload("mix"), "1", "20", "1"); code != 0 {
		t.Fatalf("record exited %d", code)
	}
	if _, _, code := runCLI(t, nil, "export", trace, "--format", "json", "-o", js); code != 0 {
		t.Fatalf("export exited %d", code)
	}
	for path, want := range map[string]os.FileMode{trace: 0o600, pb: 0o600, js: 0o600, kept: 0o640} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s has mode %v, want %v", filepath.Base(path), fi.Mode(), want)
		}
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", err)
	}
	if b, _ := os.ReadFile(kept); !bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		t.Errorf("the link's target holds %.40q, want the JSON export", b)
	}
}

// TestKilledCommandStatus: a command killed by SIGKILL makes record exit
// 137, as a shell says, and the trace's end says so.
func TestKilledCommandStatus(t *testing.T) {
	ctx, dir := traceSetup(t)
	trace := filepath.Join(dir, "k.trace")
	_, _, code := runCLI(t, nil, "record", "-q", "--lib", fakeLib, "-o", trace, "--", "sh", "-c", "kill -KILL $$")
	if code != 137 {
		t.Errorf("record exited %d, want 137", code)
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Trace struct {
			ExitCode int    `json:"exit_code"`
			Signal   string `json:"signal"`
		} `json:"trace"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Trace.ExitCode != 137 || rep.Trace.Signal != "SIGKILL" {
		t.Errorf("the trace's end says exit_code %d, signal %q; want 137, SIGKILL", rep.Trace.ExitCode, rep.Trace.Signal)
	}
}

// TestRingSizeRefused: a ring buffer that cannot hold a few allocation
// records of the stack window's size is refused with the figures.
func TestRingSizeRefused(t *testing.T) {
	_, dir := traceSetup(t)
	_, stderr, code := runCLI(t, nil, "record", "--ring-size", "4KiB", "--lib", fakeLib, "-o", filepath.Join(dir, "t"), "--", "true")
	oneLineError(t, stderr, code, "--ring-size 4KiB", "18032 bytes", "256KiB")
	_, stderr, code = runCLI(t, nil, "record", "--ring-size", "64KiB", "--stack-window", "0", "--lib", fakeLib, "-o", filepath.Join(dir, "t"), "--", "true")
	if code != 0 {
		t.Errorf("--ring-size 64KiB without a stack window: exit %d\n%s", code, stderr)
	}
}

// TestDiskFull: a trace on a file system that fills up: the command runs to
// its end, the summary has every allocation, the exit status is 125 (the
// command succeeded, the trace is incomplete), and the trace reads back up
// to where it was cut, wherever that falls (a CI run once cut it at a
// frame's end).
func TestDiskFull(t *testing.T) {
	ctx, dir := traceSetup(t)
	mnt := filepath.Join(dir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=128k"); err != nil {
		skipOrFail(t, "mount a 128 KiB tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(mnt, "full.trace")
	stdout, stderr, code := runCLI(t, fakeEnv(log), "record", "--lib", fakeLib, "-o", trace, "--", workload("mix"), "2", "2000", "5")
	if code != 125 {
		t.Errorf("record exited %d, want 125", code)
	}
	if !strings.Contains(stderr, "no space left on device") || !strings.Contains(stderr, "incomplete") {
		t.Errorf("stderr does not say the trace is incomplete for lack of space:\n%s", stderr)
	}
	want := onlyTruth(t, log, "")
	var found bool
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != strconv.Itoa(want.PID) {
			continue
		}
		found = true
		if f[2] != strconv.FormatUint(want.Allocs, 10) || f[3] != strconv.FormatUint(want.Frees, 10) || f[4] != strconv.FormatUint(want.Failed, 10) {
			t.Errorf("summary line %q: want allocs %d frees %d failed %d", line, want.Allocs, want.Frees, want.Failed)
		}
	}
	if !found {
		t.Errorf("no summary line for mix (pid %d):\n%s", want.PID, stdout)
	}
	cmd := exec.CommandContext(ctx, tracerBin, "report", trace, "--json")
	var e bytes.Buffer
	cmd.Stderr = &e
	// The file ends where the file system filled: inside a frame
	// ("truncated"), or, where that is a frame's end, with no end record.
	if err := cmd.Run(); err != nil || !strings.Contains(e.String(), "truncated") && !strings.Contains(e.String(), "no end record") ||
		!strings.Contains(e.String(), "the disk filled") {
		t.Errorf("report of the cut trace: %v, stderr %q; want it read, saying it is incomplete and why it may be", err, e.String())
	}
}

// TestExportFailureKeepsTrace: an --export that fails after the run (its
// file system filled up) loses nothing: the trace it was made from is
// kept, its path printed, and record exits 125.
func TestExportFailureKeepsTrace(t *testing.T) {
	ctx, dir := traceSetup(t)
	mnt := filepath.Join(dir, "small")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		skipOrFail(t, "mount a 64 KiB tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	// Full but for a few blocks: the check before tracing can create the
	// export's file, the export cannot write it.
	fill, err := os.Create(filepath.Join(mnt, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	for buf := make([]byte, 4096); ; {
		if _, err := fill.Write(buf); err != nil {
			break
		}
	}
	fill.Close()
	_, stderr, code := runCLI(t, fakeEnv(""), "record", "-q", "--lib", fakeLib, "--export", "json="+filepath.Join(mnt, "x.json"),
		"--", workload("mix"), "1", "300", "3")
	if code != 125 {
		t.Errorf("record exited %d, want 125", code)
	}
	i := strings.Index(stderr, "the trace is kept in ")
	if i < 0 {
		t.Fatalf("stderr does not say where the trace is kept:\n%s", stderr)
	}
	kept, _, _ := strings.Cut(stderr[i+len("the trace is kept in "):], ":")
	t.Cleanup(func() { os.Remove(kept) })
	rep := runReport(t, ctx, kept)
	if len(rep.Processes) != 1 || rep.Processes[0].Allocs == 0 {
		t.Errorf("the kept trace %s reports %d processes: want mix with its allocations", kept, len(rep.Processes))
	}
}

// TestAgentAccess: by default only root and the agent's own user read the
// agent: user nobody on the same host is refused (403) every endpoint
// root is served. With a token, the auth scheme is case-insensitive.
func TestAgentAccess(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "python3.11")
	a := startAgent(t, ctx)
	fetchAs := func(uid int, path string, header ...string) string {
		t.Helper()
		script := `import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1])
if len(sys.argv) > 2: req.add_header("Authorization", sys.argv[2])
try:
    print(urllib.request.urlopen(req, timeout=20).status)
except urllib.error.HTTPError as e:
    print(e.code)
`
		cmd := exec.CommandContext(ctx, "/usr/bin/python3.11", append([]string{"-c", script, a.url + path}, header...)...)
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python3.11 as uid %d: %v\n%s", uid, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, path := range []string{"/", "/metrics", "/debug/pprof/cuda_memory", "/trace?seconds=0.2"} {
		if got := fetchAs(65534, path); got != "403" {
			t.Errorf("GET %s as nobody: %s, want 403", path, got)
		}
		if got := fetchAs(0, path); got != "200" {
			t.Errorf("GET %s as root: %s, want 200", path, got)
		}
	}
	a.stop(t)

	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a = startAgent(t, ctx, "--token-file", tok)
	for h, want := range map[string]string{"bearer s3cret": "200", "Bearer s3cret": "200", "Bearer nope": "401"} {
		if got := fetchAs(65534, "/metrics", h); got != want {
			t.Errorf("GET /metrics as nobody with %q: %s, want %s", h, got, want)
		}
	}
	if got := fetchAs(0, "/metrics"); got != "401" {
		t.Errorf("GET /metrics as root without the token: %s, want 401", got)
	}
}

// rssOf samples pid's resident set every 20 ms until stop is closed, and
// returns the most it saw, in bytes.
func rssOf(pid int, stop <-chan struct{}) <-chan uint64 {
	out := make(chan uint64, 1)
	go func() {
		var most uint64
		for {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
					kb, _ := strconv.ParseUint(f[1], 10, 64)
					most = max(most, kb<<10)
				}
			}
			select {
			case <-stop:
				out <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return out
}

// TestAgentUnderLoad: 200 concurrent /trace windows whose clients read
// nothing and 200 concurrent profile requests, while a job allocates:
// every event of the job still reaches the agent's account (as in a quiet
// run of the same steps), no event more is lost than in the quiet run, at
// most --max-trace-windows windows are opened (the rest get 429 at once),
// every request is answered within a bound, and the agent's RSS stays
// within the documented bound (docs/agent.md, Limits) above the quiet
// run's.
func TestAgentUnderLoad(t *testing.T) {
	ctx, dir := traceSetup(t)
	ctx, cancel := context.WithTimeout(ctx, 55*time.Second)
	defer cancel()
	a := startAgent(t, ctx, "--dump-dir", "")
	j := startJob(t, ctx, filepath.Join(dir, "fake.log"))
	pid := strconv.Itoa(j.pid)
	for d := range 2 {
		j.do(t, "ok", "weights %d %d", 64<<20, d)
	}
	const steps = 1500
	counts := func() (allocs, lost float64) {
		m := parseMetrics(t, get(t, ctx, a.url+"/metrics", http.StatusOK))
		allocs, _ = metric(t, m, "cudatrace_allocations_total", "pid", pid, "level", "segment")
		lost, _ = metric(t, m, "cudatrace_lost_events_total")
		return allocs, lost
	}
	// run makes the job take steps while load runs, and returns the
	// allocations the agent counted, the events lost and the most RSS.
	run := func(load func()) (allocs, lost float64, rss uint64) {
		a0, l0 := counts()
		stop := make(chan struct{})
		most := rssOf(a.cmd.Process.Pid, stop)
		done := make(chan struct{})
		go func() { defer close(done); load() }()
		for range steps {
			j.do(t, "ok", "step %d", 4096)
		}
		<-done
		time.Sleep(300 * time.Millisecond) // the agent settles requests 120 ms after they come
		close(stop)
		a1, l1 := counts()
		return a1 - a0, l1 - l0, <-most
	}
	quietAllocs, quietLost, quietRSS := run(func() {})
	if quietAllocs != steps {
		t.Fatalf("quiet run: the agent counted %v allocations of %d", quietAllocs, steps)
	}

	const n = 200
	var (
		mu      sync.Mutex
		codes   = map[string]map[int]int{"trace": {}, "profile": {}}
		slowest time.Duration
		bodies  []io.Closer
	)
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: 2 * n}}
	t.Cleanup(client.CloseIdleConnections)
	storm := func() {
		var wg sync.WaitGroup
		for i := range 2 * n {
			kind, path := "trace", "/trace?seconds=20"
			if i%2 == 1 {
				kind, path = "profile", "/debug/pprof/cuda_memory"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, a.url+path, nil)
				resp, err := client.Do(req)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				slowest = max(slowest, took)
				if err != nil {
					codes[kind][-1]++
					return
				}
				codes[kind][resp.StatusCode]++
				if kind == "trace" && resp.StatusCode == http.StatusOK {
					bodies = append(bodies, resp.Body) // a client that reads nothing
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}()
		}
		wg.Wait()
	}
	stormAllocs, stormLost, stormRSS := run(storm)
	for _, b := range bodies {
		b.Close()
	}
	t.Logf("quiet: %v allocations, %v lost, RSS %d MiB; storm: %v allocations, %v lost, RSS %d MiB; codes %v; slowest answer %v",
		quietAllocs, quietLost, quietRSS>>20, stormAllocs, stormLost, stormRSS>>20, codes, slowest.Round(time.Millisecond))
	if stormAllocs != steps {
		t.Errorf("under load the agent counted %v allocations of %d", stormAllocs, steps)
	}
	if stormLost > quietLost {
		t.Errorf("under load %v events were lost, %v in the quiet run", stormLost, quietLost)
	}
	if got := codes["trace"][http.StatusOK]; got < 1 || got > 8 {
		t.Errorf("%d trace windows opened, want 1 to 8 (--max-trace-windows)", got)
	}
	if got := codes["trace"][http.StatusOK] + codes["trace"][http.StatusTooManyRequests]; got != n {
		t.Errorf("trace answers %v: want every one 200 or 429", codes["trace"])
	}
	if got := codes["profile"][http.StatusOK] + codes["profile"][http.StatusTooManyRequests]; got != n || codes["profile"][http.StatusOK] == 0 {
		t.Errorf("profile answers %v: want every one 200 or 429, some 200", codes["profile"])
	}
	if slowest > 40*time.Second {
		t.Errorf("the slowest answer took %v", slowest)
	}
	// docs/agent.md, Limits: 8 windows of at most 4 MiB queued, 2
	// profiles built at once.
	const bound = 96 << 20
	if stormRSS > quietRSS+bound {
		t.Errorf("RSS %d MiB under load, %d MiB quiet: more than %d MiB above", stormRSS>>20, quietRSS>>20, bound>>20)
	}
}
