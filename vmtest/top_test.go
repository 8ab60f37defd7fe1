package vmtest

// End-to-end tests of `cudatrace top`: the full-screen view driven in tmux
// (send-keys, capture-pane), and the plain lines it prints into a pipe,
// against testdata/hold, which keeps its allocations while the test looks.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// holder is a running testdata/hold.
type holder struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	stderr *lockedBuffer
	done   chan error
	log    string
}

// startHold starts hold and waits for its "ready".
func startHold(t *testing.T, log string) *holder {
	t.Helper()
	cmd := exec.CommandContext(testContext(t), workload("hold"))
	cmd.Env = fakeEnv(log)
	h := &holder{cmd: cmd, stderr: newLockedBuffer(""), lines: make(chan string, 4), done: make(chan error, 1), log: log}
	cmd.Stderr = h.stderr
	var err error
	if h.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		h.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	h.expect(t, "ready")
	return h
}

func (h *holder) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case l := <-h.lines:
		if l != want {
			t.Fatalf("hold printed %q, want %q\n%s", l, want, h.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("hold: no %q in 20 s\n%s", want, h.stderr.String())
	}
}

// hold makes hold allocate and waits until it holds; it returns the ground
// truth of what it holds.
func (h *holder) hold(t *testing.T) *procTruth {
	t.Helper()
	if _, err := io.WriteString(h.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	h.expect(t, "held")
	want := onlyTruth(t, h.log, "HOLD")
	if want.Live == 0 || gpuLiveCount(want) != 4 || len(want.Devices) != 2 {
		t.Fatalf("hold's truth: %s, want 4 live allocations of GPU memory on 2 devices", want)
	}
	return want
}

// gpuLiveCount counts the truth's live allocations of GPU memory.
func gpuLiveCount(p *procTruth) int {
	n := 0
	for _, a := range p.live {
		if a.Kind != "host" {
			n++
		}
	}
	return n
}

// release lets hold free everything and exit.
func (h *holder) release(t *testing.T) {
	t.Helper()
	h.stdin.Close()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("hold: %v\n%s", err, h.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("hold did not exit within 20 s of its release")
	}
}

// tmux runs a tmux command on the test's own server.
type tmux struct {
	t    *testing.T
	sock string
}

func (x *tmux) run(args ...string) string {
	x.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-L", x.sock, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (x *tmux) capture() string { return x.run("capture-pane", "-p", "-t", "top") }

// waitPane polls the pane until it matches, and fails with the pane.
func (x *tmux) waitPane(what string, match func(string) bool, timeout time.Duration) string {
	x.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		pane := x.capture()
		if match(pane) {
			return pane
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the pane never showed %s in %v; it shows:\n%s", what, timeout, pane)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTopTerminal: top in a tmux pane shows a held workload's live bytes as
// its ground truth says, the stacks holding them symbolized, and why NVML
// is not there; q quits with status 0 and gives the terminal back as it was.
func TestTopTerminal(t *testing.T) {
	_, dir := traceSetup(t)
	requireTool(t, "tmux")
	h := startHold(t, filepath.Join(dir, "fake.log"))
	pid := h.cmd.Process.Pid

	x := &tmux{t: t, sock: fmt.Sprintf("cudatrace-vmtest-%d", os.Getpid())}
	t.Cleanup(func() { exec.Command("tmux", "-L", x.sock, "kill-server").Run() })
	exitFile, sttyFile := filepath.Join(dir, "exit"), filepath.Join(dir, "stty")
	script := fmt.Sprintf("%s top --pid %d --lib %s --interval 200ms; echo \"top exited $?\" > %s; stty -a > %s; exec sleep 600",
		tracerBin, pid, fakeLib, exitFile, sttyFile)
	x.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", "sh", "-c", script)

	// The header comes with the first snapshot, after the probes are attached.
	x.waitPane("the header", func(p string) bool {
		return strings.Contains(p, fmt.Sprintf("cudatrace top: pid %d, every 200ms", pid))
	}, 30*time.Second)
	want := h.hold(t)
	detail := fmt.Sprintf("pid %d (hold): %s of GPU memory live in %d allocations, peak %s; %d allocations, %s, since tracing began",
		pid, humanBytes(want.Live), gpuLiveCount(want), humanBytes(want.Peak), want.Allocs, humanBytes(want.AllocBytes))
	pane := x.waitPane(strconv.Quote(detail), func(p string) bool { return strings.Contains(p, detail) }, 20*time.Second)
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^>\s+%d\s+hold\s+`, pid))
	if !row.MatchString(pane) {
		t.Errorf("no selected row for pid %d:\n%s", pid, pane)
	}
	if !strings.Contains(pane, "NVML unavailable: Driver Not Loaded") {
		t.Errorf("the pane does not say why there is no NVML figure (libnvidia-ml without a driver):\n%s", pane)
	}
	if !regexp.MustCompile(`#0 hold_alloc \(hold\.c:\d+\) hold`).MatchString(pane) {
		t.Errorf("no symbolized stack through hold_alloc:\n%s", pane)
	}
	// Per device: the truth's live bytes on GPU 0 and 1, traced.
	for _, d := range want.DeviceList() {
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^\s*%d\s+(\S+ \S+)\s+`, d))
		m := re.FindStringSubmatch(pane)
		if m == nil || m[1] != humanBytes(want.Devices[d].Live) {
			t.Errorf("GPU %d row %q, want traced %s:\n%s", d, m, humanBytes(want.Devices[d].Live), pane)
		}
	}

	// The process frees everything and exits: the view stays, with its
	// last state, and says tracing stopped.
	h.release(t)
	freed := fmt.Sprintf("pid %d (hold): 0 B of GPU memory live in 0 allocations, peak %s;", pid, humanBytes(want.Peak))
	x.waitPane("that tracing stopped", func(p string) bool {
		return strings.Contains(p, "tracing stopped: traced processes exited; q to quit") && strings.Contains(p, freed)
	}, 20*time.Second)
	x.run("send-keys", "-t", "top", "j")
	x.run("send-keys", "-t", "top", "q")
	deadline := time.Now().Add(20 * time.Second)
	var exit []byte
	for {
		var err error
		if exit, err = os.ReadFile(exitFile); err == nil && len(exit) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("top did not exit within 20 s of q:\n%s", x.capture())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if string(exit) != "top exited 0\n" {
		t.Errorf("%q, want top exited 0", exit)
	}
	// The terminal as before: line editing and echo back, the main screen,
	// the cursor shown.
	stty, err := os.ReadFile(sttyFile)
	for i := 0; err == nil && len(stty) == 0 && i < 50; i++ {
		time.Sleep(100 * time.Millisecond)
		stty, err = os.ReadFile(sttyFile)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, flag := range []string{"icanon", "echo", "isig", "icrnl", "opost"} {
		if !regexp.MustCompile(`(^|\s)` + flag + `(\s|$)`).Match(stty) {
			t.Errorf("after top, stty has no %q (raw mode left on):\n%s", flag, stty)
		}
	}
	if got := strings.TrimSpace(x.run("display-message", "-p", "-t", "top", "#{alternate_on} #{cursor_flag}")); got != "0 1" {
		t.Errorf("alternate screen and cursor after top: %q, want \"0 1\"", got)
	}
}

// humanBytes is units.Bytes, written again here on purpose.
func humanBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	v, units := float64(n)/1024, []string{"KiB", "MiB", "GiB", "TiB"}
	i := 0
	for v >= 1023.95 && i < len(units)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}

// TestTopLines: with stdout a pipe, top prints a line per process and
// per GPU at each refresh, with the held workload's exact bytes beside what
// NVML's stand-in charges it, and ends by itself with status 0 when the
// process it watches exits.
func TestTopLines(t *testing.T) {
	ctx, dir := traceSetup(t)
	h := startHold(t, filepath.Join(dir, "fake.log"))
	pid := h.cmd.Process.Pid
	procs := filepath.Join(dir, "nvml.procs")
	cmd := exec.CommandContext(ctx, tracerBin, "top", "--pid", strconv.Itoa(pid), "--lib", fakeLib, "--interval", "100ms")
	cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+fakeNVMLDir, "FAKENVML_PROCS="+procs)
	stdout, stderr := newLockedBuffer(""), newLockedBuffer("")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitOut := func(what string, match func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !match(stdout.String()) {
			if time.Now().After(deadline) {
				t.Fatalf("top printed no %s in 30 s:\n%s\nstderr:\n%s", what, truncate(stdout.String(), 4000), stderr.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitOut("first line", func(s string) bool { return strings.Contains(s, "no CUDA allocation traced yet") })
	want := h.hold(t)
	line := fmt.Sprintf(` pid=%d comm="hold" live=%d peak=%d live_allocations=%d allocs=%d alloc_bytes=%d nvml_used=- remainder=- `,
		pid, want.Live, want.Peak, gpuLiveCount(want), want.Allocs, want.AllocBytes)
	waitOut(strconv.Quote(line), func(s string) bool { return strings.Contains(s, line) })

	// NVML charges hold 300 MiB more than it allocated; pid 1 is on the
	// GPU too, and is not shown (--pid).
	const mib = 1 << 20
	d0, d1 := want.Devices[0].Live, want.Devices[1].Live
	text := fmt.Sprintf("%d 0 %d\n%d 1 %d\n1 0 4096\n", pid, d0+200*mib, pid, d1+100*mib)
	if err := os.WriteFile(procs+".tmp", []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(procs+".tmp", procs); err != nil {
		t.Fatal(err)
	}
	line = fmt.Sprintf(` pid=%d comm="hold" live=%d peak=%d live_allocations=%d allocs=%d alloc_bytes=%d nvml_used=%d remainder=%d `,
		pid, want.Live, want.Peak, gpuLiveCount(want), want.Allocs, want.AllocBytes, want.Live+300*mib, 300*mib)
	waitOut(strconv.Quote(line), func(s string) bool { return strings.Contains(s, line) })
	for d, extra := range map[int]uint64{0: 200*mib + 4096, 1: 100 * mib} {
		live := []uint64{d0, d1}[d]
		dl := fmt.Sprintf(" gpu=%d live=%d peak=%d nvml_used=%d remainder=%d total=%d\n", d, live, want.Devices[d].Peak,
			live+extra, extra, uint64(16<<30))
		waitOut(strconv.Quote(dl), func(s string) bool { return strings.Contains(s, dl) })
	}
	h.release(t)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("top: %v\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(20 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("top did not end within 20 s of its process's exit")
	}
	if strings.Contains(stderr.String(), "NVML unavailable") {
		t.Errorf("NVML's stand-in was not loaded:\n%s", stderr.String())
	}
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (pid|gpu)=\d+ |^\S+ no CUDA allocation traced yet`).MatchString(l) {
			t.Errorf("line %q is not a plain line", l)
		}
		if strings.Contains(l, " pid=1 ") {
			t.Errorf("pid 1 shown with --pid %d: %q", pid, l)
		}
	}
	// The last lines are the state when hold exited: all freed.
	last := fmt.Sprintf(` pid=%d comm="hold" live=0 peak=%d live_allocations=0 `, pid, want.Peak)
	if i := strings.LastIndex(stdout.String(), fmt.Sprintf(" pid=%d ", pid)); i < 0 || !strings.HasPrefix(stdout.String()[i:], last) {
		t.Errorf("the last line of pid %d is not %q:\n%s", pid, last, truncate(stdout.String(), 2000))
	}
}
