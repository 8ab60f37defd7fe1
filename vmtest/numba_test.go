package vmtest

// A real CUDA client nobody here wrote: Numba's CUDA target (Debian's
// python3-numba, ctypes over libcuda.so.1), running its own allocation
// code on the stand-in driver. Privileged.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestNumba: Numba's device arrays, a deferred deallocation, pinned,
// mapped and managed arrays, an allocation larger than the device with
// Numba's retry, an array on device 1 and a second thread (testdata/
// numba_job.py), launched under record. Per process and device the report
// matches the stand-in's log exactly, and so do the bytes allocated from
// each of the script's allocating lines (its innermost frame in the script).
func TestNumba(t *testing.T) {
	ctx, dir := traceSetup(t)
	const python = "/usr/bin/python3.11"
	if _, err := os.Stat("/usr/lib/python3/dist-packages/numba/cuda"); err != nil {
		skipOrFail(t, "Debian's python3-numba is not installed (scripts/deps.sh installs it): %v", err)
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "numba_job.py"))
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "numba.trace")
	env := append(fakeEnv(log), "NUMBA_CUDA_DRIVER="+fakeDriver)
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeDriver, "-o", trace, "--", python, script)
	rec.finish(t, 120*time.Second)

	want := onlyTruth(t, log, "")
	if len(want.Devices) != 2 || want.Failed != 2 || len(want.Threads) != 2 {
		t.Fatalf("ground truth: %v; want devices 0 and 1, 2 failures (the OOM and its retry), 2 threads", want)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})

	// Bytes per allocating line of the script: what numba_job.py asks for.
	checkScriptLines(t, rep, want, script, "numba_job.py", map[string]uint64{
		"to_device": 1 << 18, "device_array": 1 << 18, "deferred": 1 << 20, "pinned": 1 << 15,
		"mapped": 1 << 15, "managed": 1 << 16, "gpu1": 1 << 20, "thread": 1 << 19,
	})
}

// TestNumbaAttached: `record --pid` on a Numba job after it allocated and
// made its contexts current, a second thread inside cuda.gpus[1]
// included (testdata/numba_attach.py). What either thread allocates
// after the attach is on its device exactly, learned from Numba's own
// cuCtxGetCurrent and cuCtxGetDevice (never a guess), per process,
// device and allocating Python line as the stand-in's log has it;
// what was allocated before is not counted as traced, and the driver's figure for it (NVML's stand-in, fed
// the log's account) is reported as held before.
func TestNumbaAttached(t *testing.T) {
	ctx, dir := traceSetup(t)
	const python = "/usr/bin/python3.11"
	if _, err := os.Stat("/usr/lib/python3/dist-packages/numba/cuda"); err != nil {
		skipOrFail(t, "Debian's python3-numba is not installed (scripts/deps.sh installs it): %v", err)
	}
	script, _ := filepath.Abs(filepath.Join("testdata", "numba_attach.py"))
	log, trace, procs := filepath.Join(dir, "fake.log"), filepath.Join(dir, "numba.trace"), filepath.Join(dir, "nvml.procs")
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Env = append(fakeEnv(log), "NUMBA_CUDA_DRIVER="+fakeDriver)
	j := startCmdJob(t, "numba_attach", cmd)
	before := onlyTruth(t, log, "") // all the log has yet
	d0, d1 := before.Devices[0].Live, before.Devices[1].Live
	writeProcs(t, procs, j.pid, d0, d1)
	env := append(os.Environ(), "LD_LIBRARY_PATH="+fakeNVMLDir, "FAKENVML_PROCS="+procs)
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeDriver, "--pid", strconv.Itoa(j.pid),
		"--nvml-interval", "50ms", "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	time.Sleep(300 * time.Millisecond) // NVML's first sample, before the go line
	if _, err := fmt.Fprintln(j.in, "go"); err != nil {
		t.Fatal(err)
	}
	if got := j.reply(t); got != "numba_attach: done" {
		t.Fatalf("numba_attach said %q, want \"numba_attach: done\"", got)
	}
	// It waits for stdin to close: the tracer reads its new Python frames
	// meanwhile (an attached process is not held for them).
	time.Sleep(time.Second)
	j.in.Close()
	rec.finish(t, 120*time.Second)

	want := onlyTruth(t, log, "PHASE2")
	if want.PID != j.pid || len(want.Devices) != 2 || len(want.Threads) != 2 {
		t.Fatalf("ground truth after the attach: %v; want pid %d, devices 0 and 1, 2 threads", want, j.pid)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	checkScriptLines(t, rep, want, script, "numba_attach.py", map[string]uint64{
		"main0": 1 << 18, "main1": 1 << 20, "pinned": 1 << 15, "to_device": 1 << 17, "thread1": 1 << 19,
	})

	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var nv struct {
		Processes []struct {
			NVML struct {
				HeldBefore int64 `json:"held_before_bytes"`
			} `json:"nvml"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(out, &nv); err != nil {
		t.Fatal(err)
	}
	if len(nv.Processes) != 1 || nv.Processes[0].NVML.HeldBefore != int64(d0+d1) {
		t.Errorf("held before the attach: %+v, want %d bytes (the driver's figure then)", nv.Processes, d0+d1)
	}
}

// checkScriptLines checks the bytes allocated from each tagged line of
// script (its innermost frame there) against wantLines, whose sum must be
// the log's.
func checkScriptLines(t *testing.T, rep *report, want *procTruth, script, name string, wantLines map[string]uint64) {
	t.Helper()
	var sum uint64
	for _, b := range wantLines {
		sum += b
	}
	if want.AllocBytes != sum {
		t.Fatalf("the stand-in's log has %d bytes allocated, the script's lines %d", want.AllocBytes, sum)
	}
	gotLines := map[int]uint64{}
	for _, s := range rep.Stacks {
		if s.PID != want.PID || s.Allocs == 0 {
			continue
		}
		line := 0
		for _, f := range s.Frames {
			if f.Module == "[python]" && f.File == script {
				line = f.Line
				break
			}
		}
		gotLines[line] += s.AllocBytes
	}
	for tag, b := range wantLines {
		l := pyLine(t, name, tag)
		if gotLines[l] != b {
			t.Errorf("%s:%d (%s): %d bytes allocated, want %d", script, l, tag, gotLines[l], b)
		}
		delete(gotLines, l)
	}
	for l, b := range gotLines {
		t.Errorf("%d bytes allocated from line %d of %s (0: no frame in the script), want none", b, l, script)
	}
	if t.Failed() {
		for _, s := range rep.Stacks {
			if s.PID == want.PID {
				t.Logf("stack: %d bytes: %s", s.AllocBytes, fmt.Sprint(s.Frames))
			}
		}
	}
}
