package vmtest

// A real CUDA client nobody here wrote: PyCUDA (Debian's python3-pycuda, a
// C++ extension linked against libcuda.so.1), running its own allocation
// code on the stand-in driver. Privileged.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"
)

// pycudaTags are the allocating lines of testdata/pycuda_job.py; the
// script logs each name as a marker in the stand-in's log before the line
// runs. The attached run leaves out those on device 1.
var pycudaTags = []string{"mem_alloc", "pitch", "pagelocked", "managed", "to_gpu", "arith", "temp", "pool",
	"pool_oom", "pool_again", "ctx1", "after_detach"}

// pycudaEnv is the environment PyCUDA runs in on the stand-ins: its own
// files from scripts/deps.sh's unpacked python3-pycuda (no CUDA toolkit),
// the stand-in driver and libcurand.so.10 found first, and the nvcc
// stand-in on PATH for gpuarray's kernels (compiled every time: no cache).
func pycudaEnv(t *testing.T, dir, log string) []string {
	t.Helper()
	site := filepath.Join(kernelCache(), "pycuda", "root", "usr", "lib", "python3", "dist-packages")
	if _, err := os.Stat(filepath.Join(site, "pycuda", "driver.py")); err != nil {
		skipOrFail(t, "PyCUDA's files are not unpacked (scripts/deps.sh does it): %v", err)
	}
	if _, err := os.Stat("/usr/lib/python3/dist-packages/pytools"); err != nil {
		skipOrFail(t, "python3-pytools is not installed (scripts/deps.sh installs it): %v", err)
	}
	bin := filepath.Join(dir, "bin")
	nvcc, err := os.ReadFile(filepath.Join("testdata", "fakenvcc.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "nvcc"), nvcc, 0o755); err != nil {
		t.Fatal(err)
	}
	return append(fakeEnv(log), "PYTHONPATH="+site, "LD_LIBRARY_PATH="+fakeLibDir,
		"PATH="+bin+":"+os.Getenv("PATH"), "PYCUDA_DISABLE_CACHE=1")
}

// TestPyCUDA: PyCUDA's allocation paths (testdata/pycuda_job.py):
// mem_alloc, mem_alloc_pitch, pinned host memory (written to, mapped),
// managed memory, gpuarray (to_gpu, arithmetic that allocates, frees), a
// DeviceMemoryPool with an out-of-memory allocation and stop_holding, a
// context on device 1 detached while not current and the first context's
// detach, which frees what it still holds. Launched under record, and
// attached (--pid) once the process has made its context on device 0,
// and attached once it has made one on device 1 and never names it again:
// what it allocates before PyCUDA's own calls say the device
// (cuCtxGetDevice, which GPUArray asks) is on the device unknown.
// Per process and device the report matches the stand-in's log exactly,
// implicit frees included, and so do the allocations, bytes and failures
// of each allocating line of the script (the log names the line before
// each: its markers).
func TestPyCUDA(t *testing.T) {
	const python = "/usr/bin/python3.11" // Debian's python3-pycuda is built for it
	script, _ := filepath.Abs(filepath.Join("testdata", "pycuda_job.py"))

	t.Run("launched", func(t *testing.T) {
		ctx, dir := traceSetup(t)
		log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "pycuda.trace")
		env := pycudaEnv(t, dir, log)
		rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeDriver, "-o", trace, "--", python, script)
		rec.finish(t, 120*time.Second)

		want := onlyTruth(t, log, "")
		// The stand-in's account of what PyCUDA did: the pool's request
		// larger than the device fails 4 times (it frees a held block
		// between tries); ctx1's 5 MiB dies with it on device 1, and what
		// ctx0 still holds (pinned host memory included) with ctx0.
		if len(want.Devices) != 2 || want.Failed != 4 || want.Live != 0 || want.HostLive != 0 ||
			want.Devices[1].ImplicitFrees != 1 || want.Devices[1].ImplicitFreeBytes != 5<<20 || want.ImplicitFrees != 7 {
			t.Fatalf("ground truth: %v; want devices 0 and 1, 4 failures, nothing live, 7 implicit frees (1 on device 1)", want)
		}
		checkPyCUDA(t, ctx, trace, log, script, want, "")
	})

	t.Run("attached", func(t *testing.T) {
		ctx, log, trace, pid := runPyCUDAAttached(t, python, script, "--attach")
		want := onlyTruth(t, log, "attached")
		if want.PID != pid || len(want.Devices) != 1 || want.Devices[0] == nil || want.Failed != 4 ||
			want.Live != 0 || want.ImplicitFrees != 5 {
			t.Fatalf("ground truth: %v; want pid %d on device 0 only, 4 failures, nothing live, 5 implicit frees", want, pid)
		}
		checkPyCUDA(t, ctx, trace, log, script, want, "attached")
	})

	// Its context made on device 1 before the attach, never named again:
	// the device is what PyCUDA's own calls tell (cuCtxGetDevice, which
	// GPUArray asks after allocating), unknown until then; the context,
	// what its final ctx.pop() returns, before ctx.detach() frees it.
	t.Run("attached on device 1", func(t *testing.T) {
		ctx, log, trace, pid := runPyCUDAAttached(t, python, script, "--attach1")
		calls, err := parseLogFile(log)
		if err != nil {
			t.Fatal(err)
		}
		truths, err := groundTruth(untold(calls, "attached"), "attached")
		if err != nil || len(truths) != 1 {
			t.Fatalf("ground truth: %v, %v; want one process", truths, err)
		}
		want := truths[pid]
		// By hand from the script: mem_alloc, pitch, pagelocked (host),
		// managed and to_gpu's allocation come before GPUArray asks its
		// device; what follows is on device 1 (all of it freed). Its final
		// pop and detach free what it still holds (the pop names the
		// context): the pinned memory and the 4 allocations on the device
		// unknown.
		if want == nil || len(want.Devices) != 2 || want.Devices[unknownDevice] == nil || want.Devices[1] == nil ||
			want.Devices[unknownDevice].Peak != 3<<20+300*1024+4<<16+1<<18 || want.Failed != 4 || want.Live != 0 ||
			want.HostLive != 0 || want.ImplicitFrees != 5 || want.Devices[unknownDevice].ImplicitFrees != 4 {
			t.Fatalf("ground truth: %v; want pid %d on devices unknown and 1, 4 failures, 5 implicit frees (4 on the device unknown), nothing live", want, pid)
		}
		checkPyCUDA(t, ctx, trace, log, script, want, "attached")
	})
}

// runPyCUDAAttached runs pycuda_job.py in mode (--attach, --attach1): once
// it has made its context, `record --pid` attaches; the go line lets it
// run to its end, and the recording ends with it. It returns the test's
// context, the stand-in's log, the trace and the job's pid.
func runPyCUDAAttached(t *testing.T, python, script, mode string) (ctx context.Context, log, trace string, pid int) {
	t.Helper()
	ctx, dir := traceSetup(t)
	log, trace = filepath.Join(dir, "fake.log"), filepath.Join(dir, "pycuda.trace")
	cmd := exec.CommandContext(ctx, python, script, mode)
	cmd.Env = pycudaEnv(t, dir, log)
	j := startCmdJob(t, "pycuda_job.py", cmd) // its context is made
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeDriver, "--pid", strconv.Itoa(j.pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	if _, err := io.WriteString(j.in, "go\n"); err != nil {
		t.Fatal(err)
	}
	for j.out.Scan() { // its stdout must not fill up
		t.Logf("pycuda_job.py: %s", j.out.Text())
	}
	if err := j.cmd.Wait(); err != nil {
		t.Fatalf("pycuda_job.py %s: %v", mode, err)
	}
	rec.finish(t, 30*time.Second) // ends by itself once its target has exited
	return ctx, log, trace, j.pid
}

// untold relabels, per thread after each process's marker, what the
// thread allocated before its first call that says its device
// (cuCtxGetCurrent, cuCtxGetDevice) as on unknownDevice, and so the frees
// of that memory and the failures then: what a tracer that attached after
// the thread chose its device can know.
func untold(calls []logCall, marker string) []logCall {
	out := make([]logCall, len(calls))
	started := map[int]bool{}
	told := map[int]bool{}
	unknownPtr := map[uint64]bool{}
	for i, c := range calls {
		switch {
		case c.API == marker:
			started[c.PID] = true
		case !started[c.PID]:
		case c.API == "cuCtxGetCurrent" || c.API == "cuCtxGetDevice":
			told[c.TID] = true
		case classOf(c.API) == classAlloc && !told[c.TID]:
			c.Dev = unknownDevice
			if c.Ret == 0 {
				unknownPtr[c.Ptr] = true
			}
		case (classOf(c.API) == classFree || c.API == "implicit_free") && unknownPtr[c.Ptr]:
			c.Dev = unknownDevice
			delete(unknownPtr, c.Ptr)
		}
		out[i] = c
	}
	return out
}

// lineTruth is what the stand-in's log says one line of the script did.
type lineTruth struct {
	Allocs, Bytes, Failed uint64
}

// checkPyCUDA compares the report of trace with the stand-in's log: the
// process and its devices (checkProcess), then each allocating line of
// the script: the log's allocations after the line's marker on the same
// thread, against the report's stacks and failures whose innermost frame
// in the script is that line. With a marker, only what follows it counts.
func checkPyCUDA(t *testing.T, ctx context.Context, trace, log, script string, want *procTruth, marker string) {
	t.Helper()
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})

	// The log, per line of the script.
	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	isTag := map[string]bool{}
	for _, tag := range pycudaTags {
		isTag[tag] = true
	}
	wantLines := map[string]*lineTruth{}
	current := map[int]string{} // tid -> the last line named
	started := marker == ""
	for _, c := range calls {
		if c.PID != want.PID {
			continue
		}
		if !started {
			started = c.API == marker
			continue
		}
		if isTag[c.API] {
			current[c.TID] = c.API
			continue
		}
		if classOf(c.API) != classAlloc {
			continue
		}
		tag := current[c.TID]
		if tag == "" {
			t.Fatalf("log line %d: %s before any line was named", c.Line, c.API)
		}
		lt := wantLines[tag]
		if lt == nil {
			lt = &lineTruth{}
			wantLines[tag] = lt
		}
		if c.Ret != 0 {
			lt.Failed++
			continue
		}
		lt.Allocs++
		lt.Bytes += c.Size
	}

	// The report, per line: the innermost frame in the script.
	lineOf := func(frames []reportFrame) int {
		for _, f := range frames {
			if f.Module == "[python]" && f.File == script {
				return f.Line
			}
		}
		return 0
	}
	gotLines := map[int]*lineTruth{}
	get := func(l int) *lineTruth {
		if gotLines[l] == nil {
			gotLines[l] = &lineTruth{}
		}
		return gotLines[l]
	}
	for _, s := range rep.Stacks {
		if s.PID != want.PID || s.Allocs == 0 {
			continue
		}
		g := get(lineOf(s.Frames))
		g.Allocs += s.Allocs
		g.Bytes += s.AllocBytes
	}
	for _, f := range reportFailureFrames(t, ctx, trace) {
		if f.PID == want.PID {
			get(lineOf(f.Frames)).Failed++
		}
	}

	var tags []string
	for tag := range wantLines {
		tags = append(tags, tag)
	}
	sort.Strings(tags)
	for _, tag := range tags {
		l := pyLine(t, "pycuda_job.py", tag)
		w, g := *wantLines[tag], lineTruth{}
		if gotLines[l] != nil {
			g = *gotLines[l]
		}
		if g != w {
			t.Errorf("%s:%d (%s): %d allocations of %d bytes, %d failed; the stand-in's log: %d of %d bytes, %d failed",
				script, l, tag, g.Allocs, g.Bytes, g.Failed, w.Allocs, w.Bytes, w.Failed)
		}
		delete(gotLines, l)
	}
	for l, g := range gotLines {
		t.Errorf("line %d of %s (0: no frame in the script): %d allocations of %d bytes, %d failed; the log has none there",
			l, script, g.Allocs, g.Bytes, g.Failed)
	}
	if t.Failed() {
		for _, s := range rep.Stacks {
			if s.PID == want.PID {
				t.Logf("stack: %d allocations, %d bytes: %s", s.Allocs, s.AllocBytes, fmt.Sprint(s.Frames))
			}
		}
	}
}

// failureFrames is a failed call's pid and stack in the report's JSON.
type failureFrames struct {
	PID    int           `json:"pid"`
	Frames []reportFrame `json:"frames"`
}

// reportFailureFrames reads the failures' stacks from `report --json`.
func reportFailureFrames(t *testing.T, ctx context.Context, trace string) []failureFrames {
	t.Helper()
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatalf("cudatrace report --json: %v", err)
	}
	var rep struct {
		Failures []failureFrames `json:"failures"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("decoding the report's failures: %v", err)
	}
	return rep.Failures
}
