package vmtest

// A real CUDA client nobody here wrote: Numba's CUDA target (Debian's
// python3-numba, ctypes over libcuda.so.1), running its own allocation
// code on the stand-in driver. Privileged.

import (
	"fmt"
	"os"
	"path/filepath"
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
	wantLines := map[string]uint64{
		"to_device": 1 << 18, "device_array": 1 << 18, "deferred": 1 << 20, "pinned": 1 << 15,
		"mapped": 1 << 15, "managed": 1 << 16, "gpu1": 1 << 20, "thread": 1 << 19,
	}
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
		l := pyLine(t, "numba_job.py", tag)
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
