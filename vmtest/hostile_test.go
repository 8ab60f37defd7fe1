package vmtest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// TestAgentHostileFiles: jobs of user nobody, traced by the agent with the
// shipped capabilities, leave traps where their files were: a FIFO in
// place of the executable and of a library they mapped (and at
// "PATH (deleted)"), a symlink to a device node, and, in a chroot, an
// absolute symlink that resolves to a host file from the tracer's root.
// The agent keeps answering, loses no event of an honest pair of jobs
// beside them (their ledgers exact against the stand-in's ground truth,
// their native and Python frames named), and opens none of the traps nor
// anything outside a process's root (inotify watches them all).
func TestAgentHostileFiles(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "setpriv")
	requireTool(t, "chroot")
	requireTool(t, "mount")
	if _, err := os.Stat("/usr/bin/python3.11"); err != nil {
		skipOrFail(t, "needs Debian's /usr/bin/python3.11 (package python3.11): %v", err)
	}
	caps := shippedCaps(t)
	w := newNobodyWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// What no reader may open: root's own files, outside every job's root.
	secret, err := os.MkdirTemp("", "cudatrace-secret-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(secret) })
	hostFile := filepath.Join(secret, "host.so") // an ELF file: a reader would parse it
	copyMode(t, w.hold, hostFile, 0o644)
	devNode := filepath.Join(secret, "null")
	if err := unix.Mknod(devNode, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}

	evil := filepath.Join(w.dir, "evil")
	if err := os.Mkdir(evil, 0o777); err != nil {
		t.Fatal(err)
	}
	chownNobody(t, evil)
	libm := "/lib/x86_64-linux-gnu/libm.so.6"
	if _, err := os.Stat(libm); err != nil {
		skipOrFail(t, "needs %s: %v", libm, err)
	}

	ag := startAgentWrapped(t, ctx, shippedWrap(caps), nil, "--lib", w.lib)
	checkTracerCaps(t, ag.cmd.Process.Pid, caps)

	// Job 1: its executable and a library it mapped become FIFOs.
	fifoExe, fifoLib := filepath.Join(evil, "fifo-exe"), filepath.Join(evil, "libm.so.6")
	copyMode(t, w.hold, fifoExe, 0o755)
	copyMode(t, libm, fifoLib, 0o755)
	j1 := startNobody(t, ctx, w, "fifo-exe", w.log(t, "fifo"), "env", "LD_PRELOAD="+fifoLib, fifoExe)
	// Job 2: its executable becomes a symlink to a device node.
	devExe := filepath.Join(evil, "dev-exe")
	copyMode(t, w.hold, devExe, 0o755)
	j2 := startNobody(t, ctx, w, "dev-exe", w.log(t, "dev"), devExe)
	// Job 3: in a chroot, its executable becomes an absolute symlink to
	// the host file's path: the host file from the tracer's root.
	jail := filepath.Join(evil, "jail")
	makeJail(t, jail, w)
	jailLog := filepath.Join(jail, "job.log")
	if err := os.WriteFile(jailLog, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	os.Chmod(jailLog, 0o666)
	j3 := startUntrusted(t, ctx, "jail-exe", fakeEnv("/job.log", "LD_LIBRARY_PATH=/cudalib"),
		"chroot", fmt.Sprintf("--userspec=%d:%d", nobody, nobody), jail, "/hold")

	// The traps, laid while the jobs run, as their owner could.
	for _, p := range []string{fifoExe, fifoLib} {
		for _, q := range []string{p, p + " (deleted)"} {
			os.Remove(q)
			if err := unix.Mkfifo(q, 0o666); err != nil {
				t.Fatal(err)
			}
			chownNobody(t, q)
		}
	}
	if err := os.Remove(devExe); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(devNode, devExe); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(jail, "hold")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostFile, filepath.Join(jail, "hold")); err != nil {
		t.Fatal(err)
	}
	opened := watchOpens(t, hostFile, devNode, fifoExe, fifoExe+" (deleted)", fifoLib, fifoLib+" (deleted)")

	for _, j := range []*nobodyJob{j1, j2, j3} {
		j.goOn(t)
	}
	for _, j := range []*nobodyJob{j1, j2, j3} {
		j.expect(t, "held")
	}
	checkAnswers(t, ag.url, "after the hostile jobs allocated")

	// The honest jobs beside them.
	js := startNobodyJobs(t, ctx, w, "hold")
	js.run(t)
	c, py := js.truths(t)
	for _, tr := range []*procTruth{c, py} {
		pid := strconv.Itoa(tr.PID)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			m := parseMetrics(t, checkAnswers(t, ag.url, "while the honest jobs ran"))
			if n, _ := metric(t, m, "cudatrace_allocations_total", "pid", pid, "level", "segment"); n == float64(tr.Allocs) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the agent did not count pid %s's %d allocations within 10 s", pid, tr.Allocs)
			}
		}
		m := parseMetrics(t, checkAnswers(t, ag.url, "after the honest jobs ran"))
		for d, dt := range tr.Devices {
			wantMetric(t, m, dt.Live, "cudatrace_live_bytes", "pid", pid, "gpu", strconv.Itoa(d), "level", "segment")
			wantMetric(t, m, dt.Peak, "cudatrace_peak_bytes", "pid", pid, "gpu", strconv.Itoa(d), "level", "segment")
		}
		wantMetric(t, m, tr.AllocBytes, "cudatrace_allocated_bytes_total", "pid", pid)
	}
	m := parseMetrics(t, checkAnswers(t, ag.url, "at the end"))
	if lost, ok := metric(t, m, "cudatrace_lost_events_total"); ok && lost != 0 {
		t.Errorf("cudatrace_lost_events_total = %v, want 0", lost)
	}

	// The honest jobs' frames are named: hold's native ones, the Python
	// job's lines.
	hp := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, c.PID))
	var fns []string
	for _, s := range hp.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil {
					fns = append(fns, l.Function.Name)
				}
			}
		}
	}
	if !slices.Contains(fns, "hold_alloc") || !slices.Contains(fns, "main") {
		t.Errorf("hold's profile names %q, want hold_alloc and main", fns)
	}
	p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, py.PID))
	got := map[int64][]string{}
	for _, s := range p.Sample {
		var frames []string
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil && (l.Function.Filename == w.sites || l.Function.Filename == w.script) {
					frames = append(frames, fmt.Sprintf("%s:%d:%s", l.Function.Filename, l.Line, l.Function.Name))
				}
			}
		}
		got[s.Value[3]] = frames
	}
	bad := 0
	for i := range 200 {
		if want := siteFrames(t, w.sites, w.script, i); !slices.Equal(got[int64(siteBytes(i))], want) && bad < 5 {
			bad++
			t.Errorf("site%d: the agent's profile has Python frames %q, want %q", i, got[int64(siteBytes(i))], want)
		}
	}
	if o := opened(); len(o) > 0 {
		t.Errorf("files outside the jobs' roots, or their traps, were opened: %q", o)
	}
	js.c.end(t)
	js.py.end(t)
	for _, j := range []*nobodyJob{j1, j2, j3} {
		j.end(t)
	}
	ag.stop(t)
}

// checkAnswers requires the agent's /metrics to answer within 5 s, and
// returns it.
func checkAnswers(t *testing.T, base, when string) []byte {
	t.Helper()
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("%s: /metrics: %v", when, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: /metrics: %s, %v", when, resp.Status, err)
	}
	return b
}

// copyMode copies from to to with mode, owned by nobody.
func copyMode(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, mode); err != nil {
		t.Fatal(err)
	}
	os.Chmod(to, mode)
	chownNobody(t, to)
}

func chownNobody(t *testing.T, p string) {
	t.Helper()
	if err := os.Lchown(p, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// makeJail makes a root for the hold workload at dir: the host's /usr
// bound read-only, the world's libcudart (the probed file itself) at
// /cudalib, a copy of hold at /hold.
func makeJail(t *testing.T, dir string, w *nobodyWorld) {
	t.Helper()
	for _, d := range []string{"usr", "cudalib", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"lib", "lib64", "bin"} {
		if err := os.Symlink("usr/"+l, filepath.Join(dir, l)); err != nil {
			t.Fatal(err)
		}
	}
	lib := filepath.Join(dir, "cudalib", "libcudart.so.12")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, b := range [][2]string{{"/usr", filepath.Join(dir, "usr")}, {w.lib, lib}} {
		if out, err := exec.Command("mount", "--bind", "-o", "ro", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("mount --bind %s %s: %v %s", b[0], b[1], err, out)
		}
		t.Cleanup(func() { exec.Command("umount", "-l", b[1]).Run() })
	}
	copyMode(t, w.hold, filepath.Join(dir, "hold"), 0o755)
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// watchOpens watches paths (not following a last symlink) with inotify
// and returns a function that says which were opened since.
func watchOpens(t *testing.T, paths ...string) func() []string {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	byWD := map[int32]string{}
	for _, p := range paths {
		wd, err := unix.InotifyAddWatch(fd, p, unix.IN_OPEN|unix.IN_ACCESS|unix.IN_DONT_FOLLOW)
		if err != nil {
			t.Fatalf("inotify %s: %v", p, err)
		}
		byWD[int32(wd)] = p
	}
	return func() []string {
		var out []string
		for _, ev := range testenv.ReadInotify(fd) {
			if p := byWD[ev.Wd]; p != "" && !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
		return out
	}
}
