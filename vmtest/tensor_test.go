package vmtest

// PyTorch's tensor-level USDT probes (pytorch:malloc / pytorch:free) in a
// caching-allocator stand-in: a second level beside the segments.
// Privileged.

import (
	"encoding/json"
	"fmt"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestTensors(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "tensors.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeLib, "--lib", c10Lib, "-o", trace, "--", workload("tensors"), "40")
	rec.finish(t, 45*time.Second)

	// The workload's own tally of its tensors.
	var want struct{ allocs, frees, allocBytes, live, peak uint64 }
	out := rec.stdout.String()
	line := out[strings.Index(out, "tensors: "):]
	if _, err := fmt.Sscanf(line, "tensors: allocs=%d frees=%d alloc_bytes=%d live=%d peak=%d",
		&want.allocs, &want.frees, &want.allocBytes, &want.live, &want.peak); err != nil {
		t.Fatalf("workload printed %q: %v", line, err)
	}
	// The segments: the runtime stand-in's ground truth, as ever.
	seg := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, seg, 0, "tensors")

	data, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Processes []struct {
			TensorAllocs     uint64 `json:"tensor_allocs"`
			TensorFrees      uint64 `json:"tensor_frees"`
			TensorAllocBytes uint64 `json:"tensor_alloc_bytes"`
			TensorLive       uint64 `json:"tensor_live_bytes"`
			TensorPeak       uint64 `json:"tensor_peak_bytes"`
			LiveBytes        uint64 `json:"live_bytes"`
			Devices          []struct {
				Device     int    `json:"device"`
				TensorLive uint64 `json:"tensor_live_bytes"`
			} `json:"devices"`
		} `json:"processes"`
		Stacks []struct {
			Level  string `json:"level"`
			Frames []struct {
				Function string `json:"function"`
			} `json:"frames"`
		} `json:"stacks"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Processes) != 1 {
		t.Fatalf("%d processes", len(doc.Processes))
	}
	p := doc.Processes[0]
	got := [5]uint64{p.TensorAllocs, p.TensorFrees, p.TensorAllocBytes, p.TensorLive, p.TensorPeak}
	if w := [5]uint64{want.allocs, want.frees, want.allocBytes, want.live, want.peak}; got != w {
		t.Errorf("tensor allocs, frees, alloc_bytes, live, peak = %v, want %v (the workload's tally)", got, w)
	}
	if p.TensorLive > p.LiveBytes {
		t.Errorf("tensors hold %d bytes, more than the %d of segments they are cut from", p.TensorLive, p.LiveBytes)
	}
	var perDevice uint64
	for _, d := range p.Devices {
		perDevice += d.TensorLive
	}
	if perDevice != p.TensorLive {
		t.Errorf("tensor live bytes per device add up to %d, not %d", perDevice, p.TensorLive)
	}
	found := false
	for _, s := range doc.Stacks {
		for _, f := range s.Frames {
			found = found || (s.Level == "tensor" && f.Function == "make_activation")
		}
	}
	if !found {
		t.Errorf("no tensor-level stack through make_activation")
	}

	// The memory_viz snapshot: tensors are the active blocks of the
	// segments, their requested bytes the tensor-level live total.
	py, err := exec.LookPath("python3")
	if err != nil {
		skipOrFail(t, "no python3 to load the snapshot: %v", err)
	}
	snap := filepath.Join(dir, "t.pickle")
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "memviz", "-o", snap).CombinedOutput(); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	memviztest.Check(t, snap, memviztest.Want{})
	out2, err := exec.CommandContext(ctx, py, "-c", `
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
seg = sum(x["total_size"] for x in s["segments"])
req = sum(b["requested_size"] for x in s["segments"] for b in x["blocks"] if b["state"] == "active_allocated")
print(seg, req)
`, snap).CombinedOutput()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, out2)
	}
	var segBytes, tensorBytes uint64
	if _, err := fmt.Sscanf(string(out2), "%d %d", &segBytes, &tensorBytes); err != nil {
		t.Fatalf("python printed %q", out2)
	}
	if segBytes != p.LiveBytes || tensorBytes != want.live {
		t.Errorf("snapshot: segments %d bytes, tensor blocks request %d; want %d and %d", segBytes, tensorBytes, p.LiveBytes, want.live)
	}
}
