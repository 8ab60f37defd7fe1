package vmtest

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
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// container is a process in a container as docker, containerd and
// Kubernetes make one: a mount namespace of its own and pivot_root into
// its root, where /proc/PID/root still reads "/". Its root is the host's,
// with one directory (app) over-mounted by the container's own files:
// the host holds other builds at the same paths.
type container struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  *bufio.Reader
	stderr strings.Builder
	app    string // the directory over-mounted inside, the same path outside
}

// buildContainer builds testdata/ctr_*.c into dir: the host's copy of the
// library (host_alloc) in dir/app, the container's (container_alloc) in
// dir/ctr, the executable in both, every file -O2 -fomit-frame-pointer -g.
func buildContainer(t *testing.T, dir string) (app, ctr string) {
	t.Helper()
	app, ctr = filepath.Join(dir, "app"), filepath.Join(dir, "ctr")
	src := func(name string) string { p, _ := filepath.Abs(filepath.Join("testdata", name)); return p }
	cflags := []string{"-O2", "-fomit-frame-pointer", "-fno-optimize-sibling-calls", "-g", "-Wall"}
	for _, c := range []struct {
		dir   string
		extra []string
	}{{app, []string{"-DHOST"}}, {ctr, nil}} {
		if err := os.MkdirAll(c.dir, 0o755); err != nil {
			t.Fatal(err)
		}
		// Both link the library as app/libwork.so: the path the process
		// maps, inside and outside.
		lib := filepath.Join(c.dir, "libwork.so")
		args := append(append(append([]string{}, cflags...), c.extra...), "-shared", "-fPIC",
			"-Wl,-soname,libwork.so", "-o", lib, src("ctr_work.c"), "-L"+fakeLibDir, "-lcudart", "-Wl,-rpath,"+fakeLibDir)
		if err := gcc(args...); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(app, "ctrmain")
	if err := gcc(append(cflags, "-o", exe, src("ctr_main.c"), "-L"+app, "-lwork", "-Wl,-rpath,"+app+":"+fakeLibDir)...); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ctr, "ctrmain"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return app, ctr
}

// startContainer runs app/ctrmain in a container whose app is ctr, and
// waits for it to say it is ready.
func startContainer(t *testing.T, dir, app, ctr string, env []string) *container {
	t.Helper()
	for _, tool := range []string{"unshare", "pivot_root", "mount", "umount"} {
		requireTool(t, tool)
	}
	script := containerScript(dir, app, ctr, filepath.Join(app, "ctrmain"))
	c := &container{app: app, cmd: exec.Command("unshare", "-m", "sh", "-c", script)}
	c.cmd.Env = env
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.lines = bufio.NewReader(out)
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	c.expect(t, "ready")
	return c
}

// containerScript is what `unshare -m sh -c` runs to make the container
// and exec command in it: the host's root, bind-mounted, with ctr over
// app, pivot_root-ed into.
func containerScript(dir, app, ctr, command string) string {
	newRoot := filepath.Join(dir, "newroot")
	return strings.Join([]string{
		"set -e",
		"mount --make-rprivate /",
		"mkdir -p " + newRoot,
		"mount --rbind / " + newRoot,
		"mount --bind " + ctr + " " + newRoot + app,
		"cd " + newRoot,
		"mkdir -p old",
		"pivot_root . old",
		"umount -l /old",
		"exec " + command,
	}, "\n")
}

// expect reads the container's next line, which must be want.
func (c *container) expect(t *testing.T, want string) {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		l, _ := c.lines.ReadString('\n')
		got <- strings.TrimSpace(l)
	}()
	select {
	case l := <-got:
		if l != want {
			t.Fatalf("container printed %q, want %q; stderr:\n%s", l, want, c.stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("container printed no %q in 30s; stderr:\n%s", want, c.stderr.String())
	}
}

// pidStack returns the frames, as frameString has them, of the one stack
// of pid in rep, and the module of its innermost frame.
func pidStack(t *testing.T, rep *report, pid int) ([]string, string) {
	t.Helper()
	var found []reportStack
	for _, s := range rep.Stacks {
		if s.PID == pid {
			found = append(found, s)
		}
	}
	if len(found) != 1 || found[0].Allocs != 1 || found[0].AllocBytes != 1<<20 {
		t.Fatalf("stacks of pid %d: %+v; want one of 1 allocation of 1 MiB", pid, found)
	}
	var out []string
	for _, f := range found[0].Frames {
		out = append(out, frameString(f.Function, f.File, f.Line))
	}
	if len(found[0].Frames) == 0 {
		t.Fatalf("pid %d's stack has no frames", pid)
	}
	return out, found[0].Frames[0].Module
}

// TestContainerStacks: a process in a container (its own mount namespace,
// pivot_root) runs a library at a path where the host holds another build
// of it (other functions, lines, addresses, CFI). Traced with --pid, its
// stack is unwound with its own library's CFI and named from its own
// files, function and file:line, while it lives; never from the host's.
// After it exited, report names them from what record read while it ran
// (symbols frames in the trace).
func TestContainerStacks(t *testing.T) {
	ctx, dir := traceSetup(t)
	for _, tool := range []string{"gcc", "readlink"} {
		requireTool(t, tool)
	}
	app, ctr := buildContainer(t, dir)
	hostID, err := symbolize.BuildID(filepath.Join(app, "libwork.so"))
	if err != nil {
		t.Fatal(err)
	}
	ctrID, err := symbolize.BuildID(filepath.Join(ctr, "libwork.so"))
	if err != nil {
		t.Fatal(err)
	}
	if hostID == "" || hostID == ctrID {
		t.Fatalf("build IDs host %q, container %q: want two, different", hostID, ctrID)
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "ctr.trace")
	c := startContainer(t, dir, app, ctr, fakeEnv(log))
	pid := c.cmd.Process.Pid

	// What makes it a container, as the tracer sees it.
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || root != "/" {
		t.Fatalf("readlink /proc/%d/root = %q, %v; want \"/\" as in a container", pid, root, err)
	}
	if theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); theirs == "" {
		t.Fatal("no mount namespace")
	} else if ours, _ := os.Readlink("/proc/self/ns/mnt"); theirs == ours {
		t.Fatalf("the container shares our mount namespace %s", ours)
	}
	if id, err := symbolize.BuildID(fmt.Sprintf("/proc/%d/root%s/libwork.so", pid, app)); err != nil || id != ctrID {
		t.Fatalf("the container's libwork.so has build ID %q (%v), want %q", id, err, ctrID)
	}

	rec := startRecord(t, ctx, recordOpts{}, "--pid", strconv.Itoa(pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "allocated")
	// Long enough for the recorder to have read the event and flushed.
	time.Sleep(500 * time.Millisecond)
	if err := rec.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rec.finish(t, 20*time.Second)

	want := onlyTruth(t, log, "")
	if want.PID != pid || want.Allocs != 1 {
		t.Fatalf("ground truth: pid %d with %d allocations, want pid %d with 1", want.PID, want.Allocs, pid)
	}
	full := []string{
		frameString("container_alloc", "ctr_work.c", markedLine(t, "ctr_work.c", "container_alloc")),
		frameString("work", "ctr_work.c", markedLine(t, "ctr_work.c", "work")),
		frameString("main", "ctr_main.c", markedLine(t, "ctr_main.c", "main")),
	}
	check := func(when string, got []string, module string) {
		t.Helper()
		if len(got) < len(full) || strings.Join(got[:len(full)], "\n") != strings.Join(full, "\n") {
			t.Errorf("%s: stack, innermost first:\n  got  %q\n  want %q (then libc's start code)", when, got, full)
		}
		if want := filepath.Join(app, "libwork.so"); module != want {
			t.Errorf("%s: innermost frame's module %q, want %q (the path the process sees)", when, module, want)
		}
		for _, f := range got {
			if strings.Contains(f, "host_alloc") {
				t.Errorf("%s: a frame named from the host's file: %q", when, f)
			}
		}
	}

	rep := runReport(t, ctx, trace)
	got, module := pidStack(t, rep, pid)
	check("while it runs", got, module)
	if rep.SymbolWarning != "" {
		t.Errorf("symbol warning while it runs: %q", rep.SymbolWarning)
	}

	// Gone: the host's file at its path is another build.
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("container: %v\n%s", err, c.stderr.String())
	}
	rep = runReport(t, ctx, trace)
	got, module = pidStack(t, rep, pid)
	check("after it exited, from the names recorded", got, module)
	if rep.SymbolWarning != "" {
		t.Errorf("symbol warning after it exited: %q", rep.SymbolWarning)
	}
	// Those names are in the trace, by build ID, once each.
	named := recordedNames(t, trace)
	for _, fn := range []string{"container_alloc", "work"} {
		if n := named[ctrID+" "+fn]; n != 1 {
			t.Errorf("the trace names %s of build ID %s %d times, want 1 (all: %v)", fn, ctrID, n, named)
		}
	}
	for k := range named {
		if strings.HasPrefix(k, hostID) || strings.Contains(k, "host_alloc") {
			t.Errorf("the trace names the host's file: %q", k)
		}
	}

	// Without them (a trace of an older recorder), the frames in its
	// library stay unnamed, never named from the host's other build, and
	// report says how many and what to do.
	bare := filepath.Join(dir, "bare.trace")
	withoutSymbols(t, trace, bare)
	rep = runReport(t, ctx, bare)
	got, module = pidStack(t, rep, pid)
	if len(got) < 3 || got[0] != "" || got[1] != "" || got[2] != full[2] {
		t.Errorf("gone, no recorded names: stack %q, want two unnamed frames, then %q", got, full[2])
	}
	if module != filepath.Join(app, "libwork.so") {
		t.Errorf("gone, no recorded names: innermost module %q", module)
	}
	if want := "2 frames not named: their processes ran in containers"; !strings.HasPrefix(rep.SymbolWarning, want) ||
		!strings.Contains(rep.SymbolWarning, "run this while the job still runs") {
		t.Errorf("gone, no recorded names: symbol warning %q, want it to start %q and say what to do", rep.SymbolWarning, want)
	}
	// export says the same, once.
	out, err := exec.CommandContext(ctx, tracerBin, "export", "-f", "pprof", "-o", filepath.Join(dir, "bare.pb.gz"), bare).CombinedOutput()
	if err != nil {
		t.Fatalf("cudatrace export: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "cudatrace: warning: 2 frames not named:"); n != 1 {
		t.Errorf("export -f pprof said %d times that 2 frames were not named, want once:\n%s", n, out)
	}
}

// withoutSymbols copies the trace at from to to, leaving out its symbols
// frames.
func withoutSymbols(t *testing.T, from, to string) {
	t.Helper()
	r, err := tracefile.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w, err := tracefile.Create(to, r.Meta())
	if err != nil {
		t.Fatal(err)
	}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", from, err)
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			err = w.WriteEvent(rec.Raw)
		case tracefile.TypeProcess:
			err = w.WriteProcess(rec.Process)
		case tracefile.TypeAttach:
			err = w.WriteAttach(rec.Attach)
		case tracefile.TypeCounters:
			err = w.WriteCounters(rec.Counters)
		case tracefile.TypeEnd:
			err = w.WriteEnd(rec.End)
		case tracefile.TypeNVML:
			err = w.WriteNVML(rec.NVML)
		case tracefile.TypePython:
			err = w.WritePython(rec.Python)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// recordedNames counts the symbols frames' names of a trace by "build-ID
// function".
func recordedNames(t *testing.T, path string) map[string]int {
	t.Helper()
	r, err := tracefile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := map[string]int{}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if rec.Type == tracefile.TypeSymbols {
			for _, f := range rec.Symbols.Frames {
				out[f.BuildID+" "+f.Function]++
			}
		}
	}
}

// TestAgentContainerStacks: the agent's heap profile names the stack of a
// process in a container from the container's own files while it runs,
// and a /trace window of it carries those names, so report names it after
// the container is gone, where the host holds another build of its files.
func TestAgentContainerStacks(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "gcc")
	ctx := testContext(t)
	dir := t.TempDir()
	app, ctr := buildContainer(t, dir)
	ag := startAgent(t, ctx, "--dump-dir", "")
	c := startContainer(t, dir, app, ctr, fakeEnv(filepath.Join(dir, "fake.log")))
	pid := c.cmd.Process.Pid
	window := filepath.Join(dir, "window.trace")
	// Every process's window: the agent learns of the container's process
	// at its first record, made while the window is open.
	traceWindow(t, ag.url, 0, 3, window, func() {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
		c.expect(t, "allocated")
	})

	want := []string{
		frameString("container_alloc", "ctr_work.c", markedLine(t, "ctr_work.c", "container_alloc")),
		frameString("work", "ctr_work.c", markedLine(t, "ctr_work.c", "work")),
		frameString("main", "ctr_main.c", markedLine(t, "ctr_main.c", "main")),
	}
	var got []string
	// The agent reads the event within a poll or two.
	for deadline := time.Now().Add(10 * time.Second); ; {
		p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%d", ag.url, pid))
		if len(p.Sample) == 1 {
			got = got[:0]
			for _, l := range p.Sample[0].Location {
				for _, ln := range l.Line {
					got = append(got, frameString(ln.Function.Name, ln.Function.Filename, int(ln.Line)))
				}
			}
			if inuse := p.Sample[0].Value[3]; inuse != 1<<20 {
				t.Errorf("in-use bytes %d, want %d", inuse, 1<<20)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("profile of pid %d: %d samples after 10s, want 1", pid, len(p.Sample))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(got) < len(want) || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Errorf("agent profile's stack, innermost first:\n  got  %q\n  want %q (then libc's start code)", got, want)
	}
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("container: %v\n%s", err, c.stderr.String())
	}
	ag.stop(t)

	// The container is gone; its names are in the window.
	ctrID, err := symbolize.BuildID(filepath.Join(ctr, "libwork.so"))
	if err != nil {
		t.Fatal(err)
	}
	if n := recordedNames(t, window); n[ctrID+" container_alloc"] != 1 || n[ctrID+" work"] != 1 {
		t.Errorf("the window names container_alloc %d and work %d times under the container's build ID, want once each: %v",
			n[ctrID+" container_alloc"], n[ctrID+" work"], n)
	}
	got, module := pidStack(t, runReport(t, ctx, window), pid)
	if len(got) < len(want) || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Errorf("report of the window after the container exited, innermost first:\n  got  %q\n  want %q", got, want)
	}
	if lib := filepath.Join(app, "libwork.so"); module != lib {
		t.Errorf("report of the window: innermost module %q, want %q", module, lib)
	}
}

// TestTopContainerStacks: top's view of a process in a container names
// its stack from the container's own files.
func TestTopContainerStacks(t *testing.T) {
	_, dir := traceSetup(t)
	requireTool(t, "tmux")
	requireTool(t, "gcc")
	app, ctr := buildContainer(t, dir)
	c := startContainer(t, dir, app, ctr, fakeEnv(filepath.Join(dir, "fake.log")))
	pid := c.cmd.Process.Pid

	x := &tmux{t: t, sock: fmt.Sprintf("cudatrace-vmtest-ctr-%d", os.Getpid())}
	t.Cleanup(func() { exec.Command("tmux", "-L", x.sock, "kill-server").Run() })
	script := fmt.Sprintf("%s top --pid %d --interval 200ms; exec sleep 600", tracerBin, pid)
	x.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "50", "sh", "-c", script)
	x.waitPane("the header", func(p string) bool {
		return strings.Contains(p, fmt.Sprintf("cudatrace top: pid %d, every 200ms", pid))
	}, 30*time.Second)
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "allocated")
	want := fmt.Sprintf(`#0 container_alloc \(ctr_work\.c:%d\) libwork\.so\s+#1 work \(ctr_work\.c:%d\) libwork\.so\s+#2 main \(ctr_main\.c:%d\) ctrmain`,
		markedLine(t, "ctr_work.c", "container_alloc"), markedLine(t, "ctr_work.c", "work"), markedLine(t, "ctr_main.c", "main"))
	re := regexp.MustCompile(want)
	pane := x.waitPane("the container's stack", re.MatchString, 20*time.Second)
	if strings.Contains(pane, "host_alloc") {
		t.Errorf("a frame named from the host's file:\n%s", pane)
	}
	c.stdin.Close()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("container: %v\n%s", err, c.stderr.String())
	}
}

// TestContainerPython: CPython 3.13 whose interpreter and libpython are
// the container's own, at paths where the host has none, launched in the
// container by record. Its allocation's Python frames are read (the
// interpreter found through /proc/PID/root), and its native frames in
// libpython are named after it exited, from what record read while it ran.
func TestContainerPython(t *testing.T) {
	ctx, dir := traceSetup(t)
	for _, tool := range []string{"gcc", "unshare", "pivot_root", "mount", "umount"} {
		requireTool(t, tool)
	}
	python := pyenvPython(t, "3.13")
	home := filepath.Dir(filepath.Dir(python))
	app, ctr := filepath.Join(dir, "app"), filepath.Join(dir, "ctr")
	for _, d := range []string{app, ctr} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{python, filepath.Join(home, "lib", "libpython3.13.so.1.0")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctr, filepath.Base(f)), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	threads := filepath.Join(dir, "pythread.so")
	if err := gcc("-shared", "-fPIC", "-O2", "-Wall", "-o", threads, filepath.Join("testdata", "pythread.c"), fakeLib); err != nil {
		t.Fatal(err)
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "py.trace")
	// LD_LIBRARY_PATH comes before the interpreter's RUNPATH: the
	// container's libpython is the one loaded.
	env := fakeEnv(log, "LD_LIBRARY_PATH="+app, "PYTHONHOME="+home)
	cmd := containerScript(dir, app, ctr, strings.Join([]string{filepath.Join(app, "python3.13"), script, fakeLib, threads}, " "))
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeLib, "-o", trace, "--", "unshare", "-m", "sh", "-c", cmd)
	rec.finish(t, 60*time.Second)
	if strings.Contains(rec.stderr.String(), "Python frames left out") {
		t.Errorf("record left Python frames out:\n%s", rec.stderr.String())
	}
	truth := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	var nested *reportStack
	for i, s := range rep.Stacks {
		if s.PID == truth.PID && s.AllocBytes == 3<<20 {
			nested = &rep.Stacks[i]
		}
	}
	if nested == nil {
		t.Fatalf("no stack of pid %d's 3 MiB allocation: %+v", truth.PID, rep.Stacks)
	}
	want := []string{
		fmt.Sprintf("%s:%d:Model.leaf", script, pyLine(t, "pyframes.py", "leaf")),
		fmt.Sprintf("%s:%d:Model.middle", script, pyLine(t, "pyframes.py", "middle")),
		fmt.Sprintf("%s:%d:outer", script, pyLine(t, "pyframes.py", "outer")),
		fmt.Sprintf("%s:%d:<module>", script, pyLine(t, "pyframes.py", "main")),
	}
	var py []string
	runMain := ""
	for _, f := range nested.Frames {
		if f.Module == "[python]" {
			py = append(py, fmt.Sprintf("%s:%d:%s", f.File, f.Line, f.Function))
		}
		if f.Function == "Py_RunMain" {
			runMain = f.Module
		}
	}
	if strings.Join(py, "\n") != strings.Join(want, "\n") {
		t.Errorf("Python frames:\n%s\nwant:\n%s", strings.Join(py, "\n"), strings.Join(want, "\n"))
	}
	if lib := filepath.Join(app, "libpython3.13.so.1.0"); runMain != lib {
		t.Errorf("Py_RunMain in module %q, want %q: libpython's frames unnamed after it exited", runMain, lib)
	}
	if _, err := os.Stat(filepath.Join(app, "libpython3.13.so.1.0")); err == nil {
		t.Fatal("the container's libpython is visible on the host: the test proves nothing")
	}
}
