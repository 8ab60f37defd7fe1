package vmtest

// PyTorch's tensor-level USDT probes (pytorch:malloc / pytorch:free) in a
// caching-allocator stand-in: a second level beside the segments.
// Privileged.

import (
	"context"
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
	out := rec.stdout.String()
	p, want := checkTensorTally(t, ctx, trace, out, onlyTruth(t, log, ""))
	checkByViews(t, ctx, trace, out)

	// go tool pprof -top totals the GPU memory as the driver holds it (the
	// segments), tensors inside it not counted again; the tensors have a
	// sample type of their own.
	pb := filepath.Join(dir, "t.pb.gz")
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "pprof", "-o", pb).CombinedOutput(); err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	if got := pprofTopTotal(t, ctx, pb); got != p.LiveBytes {
		t.Errorf("go tool pprof -top totals %d bytes, want the report's GPU live %d", got, p.LiveBytes)
	}
	if got := pprofTopTotal(t, ctx, pb, "-sample_index=tensor_inuse_space"); got != want.live {
		t.Errorf("go tool pprof -top -sample_index=tensor_inuse_space totals %d bytes, want the tensors' %d", got, want.live)
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

// tensorTally is the tensors workload's own tally of its tensors.
type tensorTally struct{ allocs, frees, allocBytes, live, peak uint64 }

// tensorProcess is the report's one process of a tensors trace.
type tensorProcess struct {
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
}

// checkTensorTally checks the trace of the tensors workload, which printed
// out, against its own tally (the tensors, from the USDT probes) and the
// stand-in's ground truth seg (the segments); it returns the report's
// process and the tally.
func checkTensorTally(t *testing.T, ctx context.Context, trace, out string, seg *procTruth) (tensorProcess, tensorTally) {
	t.Helper()
	var want tensorTally
	i := strings.Index(out, "tensors: ")
	if i < 0 {
		t.Fatalf("the workload printed no tally: %q", out)
	}
	line := out[i:]
	if _, err := fmt.Sscanf(line, "tensors: allocs=%d frees=%d alloc_bytes=%d live=%d peak=%d",
		&want.allocs, &want.frees, &want.allocBytes, &want.live, &want.peak); err != nil {
		t.Fatalf("workload printed %q: %v", line, err)
	}
	// The segments: the runtime stand-in's ground truth, as ever.
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, seg, 0, "tensors")

	data, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Processes []tensorProcess `json:"processes"`
		Stacks    []struct {
			TensorAllocs uint64 `json:"tensor_allocs"`
			Allocs       uint64 `json:"allocs"`
			Frames       []struct {
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
	// One entry per call path, both levels side by side: make_activation's
	// path both used tensors and acquired segments.
	found := false
	for _, s := range doc.Stacks {
		for _, f := range s.Frames {
			found = found || (s.TensorAllocs > 0 && s.Allocs > 0 && f.Function == "make_activation")
		}
	}
	if !found {
		t.Errorf("no stack through make_activation with both tensors and segments")
	}
	return p, want
}

// viewTruth is one row of the workload's own tally (tensors.c): per call
// site in main or per helper, tensor bytes used from the pool, segment
// bytes acquired from the device (the stand-in's count), tensor bytes
// freed, what is live.
type viewTruth struct {
	used, usedCount, acquired, acquiredCount, freed, usedLive uint64
}

// checkByViews: `report --by function` and `--by line` of the tensors
// workload's trace, row by row against its own tally: used, acquired,
// occurrences, live, and with --interval the bytes added and removed
// (summed over the intervals: which interval a call fell in is the
// clock's).
func checkByViews(t *testing.T, ctx context.Context, trace, stdout string) {
	t.Helper()
	truth := map[string]viewTruth{}
	for _, line := range strings.Split(stdout, "\n") {
		var key string
		var v viewTruth
		var n int
		if strings.HasPrefix(line, "site: ") {
			var ln int
			_, err := fmt.Sscanf(line, "site: line=%d used=%d used_count=%d acquired=%d acquired_count=%d freed=%d used_live=%d",
				&ln, &v.used, &v.usedCount, &v.acquired, &v.acquiredCount, &v.freed, &v.usedLive)
			if err != nil {
				t.Fatalf("workload printed %q: %v", line, err)
			}
			key, n = fmt.Sprintf("tensors.c:%d", ln), 1
		} else if strings.HasPrefix(line, "function: ") {
			_, err := fmt.Sscanf(line, "function: name=%s used=%d used_count=%d acquired=%d acquired_count=%d freed=%d used_live=%d",
				&key, &v.used, &v.usedCount, &v.acquired, &v.acquiredCount, &v.freed, &v.usedLive)
			if err != nil {
				t.Fatalf("workload printed %q: %v", line, err)
			}
			n = 1
		}
		if n > 0 {
			truth[key] = v
		}
	}
	if len(truth) != 6 {
		t.Fatalf("the workload's tally has %d rows, want 4 call sites and 2 functions:\n%s", len(truth), stdout)
	}
	for _, by := range []string{"function", "line"} {
		data, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--by", by, "--interval", "20ms", "--json").Output()
		if err != nil {
			t.Fatalf("report --by %s: %v", by, err)
		}
		var doc struct {
			By   string `json:"by"`
			View []struct {
				Key               string `json:"key"`
				UsedBytes         uint64 `json:"used_bytes"`
				UsedCount         uint64 `json:"used_count"`
				AcquiredBytes     uint64 `json:"acquired_bytes"`
				AcquiredCount     uint64 `json:"acquired_count"`
				Occurrences       uint64 `json:"occurrences"`
				UsedLiveBytes     uint64 `json:"used_live_bytes"`
				AcquiredLiveBytes uint64 `json:"acquired_live_bytes"`
				Intervals         []struct {
					Added   uint64 `json:"added_bytes"`
					Removed uint64 `json:"removed_bytes"`
				} `json:"intervals"`
			} `json:"view"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, r := range doc.View {
			want, ok := truth[filepath.Base(r.Key)] // the file is named as built: its path
			if !ok {
				continue // the stand-in's and libc's rows, main's own
			}
			checked++
			var added, removed uint64
			for _, iv := range r.Intervals {
				added += iv.Added
				removed += iv.Removed
			}
			got := [8]uint64{r.UsedBytes, r.UsedCount, r.AcquiredBytes, r.AcquiredCount, r.Occurrences, r.UsedLiveBytes, added, removed}
			w := [8]uint64{want.used, want.usedCount, want.acquired, want.acquiredCount, want.usedCount + want.acquiredCount,
				want.usedLive, want.used + want.acquired, want.freed}
			if got != w || r.AcquiredLiveBytes != want.acquired {
				t.Errorf("--by %s, %s: used, count, acquired, count, occurrences, used live, added, removed = %v, acquired live %d; want %v, %d (the workload's tally)",
					by, r.Key, got, r.AcquiredLiveBytes, w, want.acquired)
			}
		}
		wantRows := 2 // make_weight, make_activation
		if by == "line" {
			wantRows = 4 // main's four call sites
		}
		if checked != wantRows {
			t.Errorf("--by %s: %d of the workload's %d rows in the view: %s", by, checked, wantRows, data)
		}
	}
}
