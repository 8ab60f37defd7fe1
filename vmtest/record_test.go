package vmtest

// End-to-end tests of `cudatrace record` and `cudatrace report --json`
// against the stand-in libcudart's ground truth. Privileged.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// traceSetup is what every tracer test starts with.
func traceSetup(t *testing.T) (ctx context.Context, dir string) {
	t.Helper()
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	return testContext(t), t.TempDir()
}

// onlyTruth returns the one process of a ground truth.
func onlyTruth(t *testing.T, log, marker string) *procTruth {
	t.Helper()
	truths, err := groundTruthFile(log, marker)
	if err != nil {
		t.Fatalf("ground truth from %s: %v", log, err)
	}
	if len(truths) != 1 {
		t.Fatalf("ground truth has pids %v, want one", keys(truths))
	}
	for _, p := range truths {
		return p
	}
	return nil
}

// TestLaunchedMix: record a launched multi-threaded mix of every API.
func TestLaunchedMix(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "mix.trace")
	const threads = 4
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeLib, "-o", trace, "--", workload("mix"), strconv.Itoa(threads), "300", "7")
	rec.finish(t, 50*time.Second)

	checkMixTrace(t, ctx, log, trace, threads)
}

// TestAttachPID: attach to a running process; only what it does after the
// attach counts, frees of older allocations included.
func TestAttachPID(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "attach.trace")
	p := startAttachLater(t, log)
	pid := p.cmd.Process.Pid
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--pid", strconv.Itoa(pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Fatalf("attach_later: %v\n%s", err, p.stderr.String())
	}
	rec.finish(t, 20*time.Second) // ends by itself once its target has exited

	want := onlyTruth(t, log, "PHASE2")
	if want.PID != pid {
		t.Fatalf("ground truth for pid %d, want %d", want.PID, pid)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	// Phase 2's second thread is joined before the main thread goes on: the
	// order is fixed and the peaks are exact.
	checkProcess(t, rep, want, 0, "attach_later")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{pid: want})
	// The trace starts after the process's first allocations: its memviz
	// export lists only memory it saw, and memory_viz can walk it.
	checkMemvizExport(t, ctx, trace, pid)
}

// TestShortLived: children of the launched command are traced, each
// process on its own ledger, even when it exits at once.
func TestShortLived(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "short.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log), Dir: binDir},
		"--lib", fakeLib, "-o", trace, "--", "sh", "-c", "for i in 1 2 3 4 5; do ./shortlived; done")
	rec.finish(t, 45*time.Second)

	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(truths) != 5 {
		t.Fatalf("ground truth has pids %v, want 5", keys(truths))
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	for _, want := range truths {
		checkProcess(t, rep, want, 0, "shortlived")
	}
	checkNoOtherProcesses(t, rep, truths)
}

// TestSystemWide: --all with --lib traces processes started after the
// attach, until --duration.
func TestSystemWide(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "all.trace")
	const duration = 5 * time.Second
	rec := startRecord(t, ctx, recordOpts{}, "--all", "--lib", fakeLib, "-o", trace, "--duration", duration.String())
	rec.waitAttached(t, 30*time.Second)
	attached := time.Now()

	const threads = 2
	var wg sync.WaitGroup
	pids := make([]int, 2)
	errs := make([]error, 2)
	for i, seed := range []string{"11", "12"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(ctx, workload("mix"), strconv.Itoa(threads), "150", seed)
			cmd.Env = fakeEnv(log)
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("mix %s: %v\n%s", seed, err, out)
			}
			pids[i] = cmd.Process.Pid
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(attached); took > duration-time.Second {
		t.Fatalf("the workloads took %v after the attach: too close to --duration %v for the test to mean anything", took, duration)
	}
	rec.finish(t, duration+20*time.Second)
	if took := time.Since(rec.start); took < duration {
		t.Errorf("cudatrace record --duration %v ended after %v", duration, took)
	}

	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	for _, pid := range pids {
		want := truths[pid]
		if want == nil {
			t.Fatalf("no ground truth for mix pid %d (have %v)", pid, keys(truths))
		}
		checkProcess(t, rep, want, peakSlack(want, threads), "mix")
	}
	// Other processes on the host may show up with --all: not checked.
}

// TestRealLibcudart: NVIDIA's own libcudart, stripped and without a GPU:
// every cudaMalloc fails, and the report says how.
func TestRealLibcudart(t *testing.T) {
	requirePrivileged(t)
	needRealCuda(t)
	needTracer(t)
	ctx, dir := testContext(t), t.TempDir()
	trace, outFile := filepath.Join(dir, "real.trace"), filepath.Join(dir, "realcuda.out")
	rec := startRecord(t, ctx, recordOpts{}, "--lib", realLibcudart, "-o", trace, "--", workload("realcuda"), outFile)
	rec.finish(t, 50*time.Second)
	printed, err := parseRealcudaOutput(readFileString(outFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("realcuda printed: pid %d, results %v", printed.PID, printed.Results)

	rep := runReport(t, ctx, trace)
	p := rep.process(printed.PID)
	if p == nil {
		t.Fatalf("realcuda (pid %d) not in the report (pids %v)", printed.PID, rep.pids())
	}
	if p.Failed != 3 || p.Allocs != 0 || p.Frees != 0 || p.LiveBytes != 0 || p.AllocBytes != 0 {
		t.Errorf("realcuda: %+v, want failed 3 and nothing else", *p)
	}
	var fails []reportFailure
	for _, f := range rep.Failures {
		if f.PID == printed.PID {
			fails = append(fails, f)
		}
	}
	sort.Slice(fails, func(i, j int) bool { return fails[i].Size < fails[j].Size })
	if len(fails) != 3 {
		t.Fatalf("%d failures for realcuda, want 3: %+v", len(fails), fails)
	}
	for i, f := range fails {
		res := printed.Results[i]
		name, known := cudaErrorNames[res]
		if f.API != "cudaMalloc" || f.Size != printed.Sizes[i] || f.Result != res || f.Device != 0 || f.TID != printed.PID {
			t.Errorf("failure %+v, want cudaMalloc of %d on device 0 by tid %d returning %d", f, printed.Sizes[i], printed.PID, res)
		}
		if known && f.Error != name {
			t.Errorf("failure %+v: error %q, want %q", f, f.Error, name)
		}
	}
}

// TestErrors: user errors give a short message with a hint, and a non-zero
// exit, not a Go stack trace.
func TestErrors(t *testing.T) {
	requirePrivileged(t)
	needTracer(t)

	nopid := 999999
	for ; ; nopid++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", nopid)); os.IsNotExist(err) {
			break
		}
	}

	run := func(t *testing.T, hint string, args ...string) {
		t.Helper()
		ctx := testContext(t)
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, tracerBin, args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		msg := stderr.String()
		defer func() {
			if t.Failed() {
				t.Logf("cudatrace %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, truncate(stdout.String(), 4<<10), truncate(msg, 8<<10))
			}
		}()
		var ee *exec.ExitError
		switch {
		case err == nil:
			t.Fatalf("exited 0, want an error")
		case ctx.Err() != nil:
			t.Fatalf("still running after 20 s")
		case !errors.As(err, &ee) || ee.ExitCode() <= 0:
			t.Fatalf("did not exit with an error code: %v", err)
		}
		if strings.Contains(msg, "goroutine ") || strings.Contains(msg, "panic:") {
			t.Errorf("stderr holds a Go stack trace")
		}
		if lines := strings.Count(strings.TrimSpace(msg), "\n") + 1; len(msg) > 1024 || lines > 5 {
			t.Errorf("stderr is %d bytes, %d lines: want a short message", len(msg), lines)
		}
		if !strings.Contains(strings.ToLower(msg), strings.ToLower(hint)) {
			t.Errorf("stderr does not mention %q", hint)
		}
	}

	t.Run("NoSuchPID", func(t *testing.T) {
		run(t, "no such process", "record", "--pid", strconv.Itoa(nopid), "-o", filepath.Join(t.TempDir(), "t"))
	})
	t.Run("MissingLib", func(t *testing.T) {
		run(t, "/nonexistent", "record", "--lib", "/nonexistent", "-o", filepath.Join(t.TempDir(), "t"), "--", "true")
	})
	t.Run("NotPrivileged", func(t *testing.T) {
		// The same binary as nobody: no CAP_BPF, no CAP_PERFMON.
		ctx := testContext(t)
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		// A copy nobody can reach: the build directories are root's alone.
		pub, err := os.MkdirTemp("", "cudatrace-nobody-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(pub) })
		bin := filepath.Join(pub, "cudatrace")
		data, err := os.ReadFile(tracerBin)
		if err == nil {
			err = os.WriteFile(bin, data, 0o755)
		}
		if err == nil {
			err = os.Chmod(pub, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, bin, "record", "--lib", "/usr/lib/x86_64-linux-gnu/libc.so.6", "--", "true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		msg := string(out)
		if err == nil || !strings.Contains(msg, "CAP_BPF") || !strings.Contains(msg, "hint:") || strings.Contains(msg, "goroutine ") {
			t.Errorf("as nobody: %v\n%s\nwant an error naming CAP_BPF with a hint", err, msg)
		}
	})
	// No CUDA loaded yet is not an error (issue 17): record waits for the
	// process to load it, says so once, and ends at --duration.
	t.Run("NoCudaLibraryYet", func(t *testing.T) {
		ctx := testContext(t)
		sleep := exec.CommandContext(ctx, "sleep", "60")
		if err := sleep.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
		pid := strconv.Itoa(sleep.Process.Pid)
		out, err := exec.CommandContext(ctx, tracerBin, "record", "--pid", pid, "--duration", "2s",
			"-o", filepath.Join(t.TempDir(), "t")).CombinedOutput()
		waiting := "cudatrace: pid " + pid + " has not loaded CUDA yet"
		if err != nil || strings.Count(string(out), waiting) != 1 {
			t.Errorf("record --pid %s (no CUDA): %v\n%s\nwant exit 0 and %q once", pid, err, out, waiting)
		}
	})
}

// TestKillLeavesNoProbes: a tracer killed with SIGKILL leaves no BPF
// program behind (nothing pinned, nothing held by another process).
func TestKillLeavesNoProbes(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "bpftool")
	rec := startRecord(t, ctx, recordOpts{}, "--all", "--lib", fakeLib, "-o", filepath.Join(dir, "kill.trace"))
	rec.waitAttached(t, 30*time.Second)
	during, err := ctProgs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Ours: those our tracer holds file descriptors of (other cudatraces
	// may run on this host at the same time).
	pid := rec.cmd.Process.Pid
	held, _ := bpfObjectsOf(t, pid)
	ours := map[int]string{}
	for _, p := range during {
		if slices.Contains(held, p.ID) {
			ours[p.ID] = p.Name
		}
	}
	if len(ours) == 0 {
		t.Fatalf("no ct_* BPF program loaded while cudatrace (pid %d) is attached: the check would prove nothing; ct_* programs: %+v", pid, during)
	}
	t.Logf("cudatrace holds %d ct_* programs: %v", len(ours), ours)

	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-rec.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("cudatrace did not die of SIGKILL")
	}
	var left []string
	for deadline := time.Now().Add(2 * time.Second); ; {
		now, err := ctProgs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left = left[:0]
		for _, p := range now {
			if _, ok := ours[p.ID]; ok {
				left = append(left, fmt.Sprintf("%d:%s", p.ID, p.Name))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) != 0 {
		t.Errorf("2 s after SIGKILL these BPF programs of the tracer are still loaded: %v", left)
	}
}

// TestKilledTracerLeavesReadableTrace: a tracer killed with SIGKILL leaves
// a trace that reports every event it had flushed, and says it is
// incomplete.
func TestKilledTracerLeavesReadableTrace(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "killed.trace")
	rec := startRecord(t, ctx, recordOpts{}, "--all", "--lib", fakeLib, "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	cmd := exec.CommandContext(ctx, workload("mix"), "2", "150", "21")
	cmd.Env = fakeEnv(log)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mix: %v\n%s", err, out)
	}
	// The recorder flushes the trace every poll tick (50 ms).
	time.Sleep(500 * time.Millisecond)
	if err := syscall.Kill(rec.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-rec.done

	want := onlyTruth(t, log, "")
	cmd = exec.CommandContext(ctx, tracerBin, "report", trace, "--json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("report of a killed trace: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "did not stop cleanly") {
		t.Errorf("report stderr %q does not say the trace is incomplete", stderr.String())
	}
	rep, err := decodeReport(stdout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	checkProcess(t, rep, want, peakSlack(want, 2), "mix")
}

// TestOptionalSymbols: a libcudart lacking the optional entry points (an
// older CUDA) is traced with what it has, and says what it lacks; one
// lacking a required entry point is refused with its name.
func TestOptionalSymbols(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, dir := testContext(t), t.TempDir()
	build := func(name string, syms ...string) string {
		t.Helper()
		vs := filepath.Join(dir, name+".map")
		script := "libcudart.so.12 { global: " + strings.Join(syms, "; ") + "; local: *; };\n"
		if err := os.WriteFile(vs, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		lib := filepath.Join(dir, name, "libcudart.so.12")
		os.MkdirAll(filepath.Dir(lib), 0o755)
		// -s: stripped to .dynsym like NVIDIA's, so hidden functions are gone.
		if err := gcc("-shared", "-fPIC", "-O2", "-s", "-pthread", "-Wl,-soname,libcudart.so.12", "-Wl,--version-script="+vs,
			"-o", lib, filepath.Join("testdata", "fakecudart.c")); err != nil {
			t.Fatal(err)
		}
		return lib
	}
	old := build("old", "cudaMalloc", "cudaFree", "cudaSetDevice", "cudaGetDevice", "cudaGetLastError")
	cmd := exec.CommandContext(ctx, tracerBin, "record", "--lib", old, "--", "true")
	out, err := cmd.CombinedOutput()
	msg := string(out)
	if err != nil {
		t.Fatalf("record with an old libcudart: %v\n%s", err, msg)
	}
	for _, want := range []string{"lacks cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync, cudaMallocManaged, cudaMallocPitch, cudaMalloc3D, cudaMallocHost, cudaHostAlloc, cudaFreeHost", "attached 5 probes"} {
		if !strings.Contains(msg, want) {
			t.Errorf("output lacks %q:\n%s", want, msg)
		}
	}

	broken := build("broken", "cudaMallocAsync", "cudaFree")
	cmd = exec.CommandContext(ctx, tracerBin, "record", "--lib", broken, "--", "true")
	out, err = cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "lacks [cudaMalloc]") || !strings.Contains(string(out), "hint:") {
		t.Errorf("record with a libcudart lacking cudaMalloc: %v\n%s; want an error naming cudaMalloc", err, out)
	}
}

// TestRecordNoSymbolize: record --no-symbolize names no frame into the
// trace (where --portable names every one): the trace keeps addresses and
// mappings, report names the stacks from the files it finds, and an
// --export written on stop keeps addresses.
func TestRecordNoSymbolize(t *testing.T) {
	ctx, dir := traceSetup(t)
	for _, mode := range []string{"--portable", "--no-symbolize"} {
		log, trace := filepath.Join(dir, mode[2:]+".log"), filepath.Join(dir, mode[2:]+".trace")
		exp := filepath.Join(dir, mode[2:]+".json")
		rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
			"--lib", fakeLib, mode, "-o", trace, "--export", "json="+exp, "--", workload("mix"), "2", "20", "7")
		rec.finish(t, 50*time.Second)
		names := recordedNames(t, trace)
		if mode == "--portable" && len(names) == 0 {
			t.Fatalf("%s: no frame named into the trace", mode)
		}
		if mode == "--no-symbolize" && len(names) != 0 {
			t.Errorf("%s: %d names in the trace, want none: %v", mode, len(names), names)
		}
		// Named at report time, either way.
		want := onlyTruth(t, log, "")
		checkStacks(t, runReport(t, ctx, trace), want.PID, workload("mix"), "alloc_device_buffer", "worker_main")
		data, err := os.ReadFile(exp)
		if err != nil {
			t.Fatal(err)
		}
		var doc report
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		named := 0
		for _, s := range doc.Stacks {
			for _, f := range s.Frames {
				if f.Function != "" {
					named++
				}
			}
		}
		if (named == 0) != (mode == "--no-symbolize") {
			t.Errorf("%s: the export written on stop names %d frames", mode, named)
		}
	}
}

// TestRecordUntracedNeighbour: `record -- CMD` while another process,
// not traced, calls the same library file all along (agentload stepping):
// the probes run for its calls too, but they are not this recording's.
// No event is reported lost, and the traced process's account is the
// stand-in's log's, exactly.
func TestRecordUntracedNeighbour(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "mix.log"), filepath.Join(dir, "mix.trace")
	other := startJob(t, ctx, filepath.Join(dir, "other.log"))
	stop, stepped := make(chan struct{}), make(chan int)
	go func() { // no t.Fatal off the test's goroutine: errors end the loop
		n := 0
		defer func() { stepped <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := fmt.Fprintln(other.in, "steps 100 4096"); err != nil || !other.out.Scan() || other.out.Text() != "ok" {
				return
			}
			n++
		}
	}()
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "--lib", fakeLib, "-o", trace, "--", workload("mix"), "2", "20", "7")
	rec.finish(t, 50*time.Second)
	close(stop)
	if n := <-stepped; n < 2 {
		t.Fatalf("the untraced neighbour ran %d rounds of steps beside the recording, want several", n)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0: the untraced neighbour's calls are not this recording's", rep.LostEvents)
	}
	want := onlyTruth(t, log, "")
	checkProcess(t, rep, want, peakSlack(want, 2), "") // two threads: the peak depends on how their calls interleave
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
}
