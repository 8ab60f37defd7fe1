package vmtest

// End-to-end tests of the exports: a traced stand-in workload, exported by
// `cudatrace record --export` and `cudatrace export`, against the stand-in
// libcudart's ground truth. Privileged.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/internal/memviztest"
)

func TestExports(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "mix.trace")
	pb, snap, timeline := filepath.Join(dir, "mix.pb.gz"), filepath.Join(dir, "mix.pickle"), filepath.Join(dir, "mix.json")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "--lib", fakeLib, "-o", trace,
		"--export", "pprof="+pb, "--export", "memviz="+snap, "--export", "perfetto="+timeline,
		"--", workload("mix"), "3", "200", "11")
	rec.finish(t, 50*time.Second)
	want := onlyTruth(t, log, "")

	t.Run("pprof", func(t *testing.T) {
		f, err := os.Open(pb)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		p, err := profile.Parse(f)
		if err != nil {
			t.Fatal(err)
		}
		idx := map[string]int{}
		for i, st := range p.SampleType {
			idx[st.Type] = i
		}
		var sum [4]int64
		var gpuLive int64
		found := false
		for _, s := range p.Sample {
			// GPU memory and pinned host memory, each in its own group.
			for i, k := range []string{"alloc_objects", "alloc_space", "inuse_objects", "inuse_space"} {
				sum[i] += s.Value[idx[k]] + s.Value[idx["host_"+k]]
			}
			gpuLive += s.Value[idx["inuse_space"]]
			for _, loc := range s.Location {
				for _, l := range loc.Line {
					found = found || (l.Function != nil && l.Function.Name == "alloc_device_buffer")
				}
			}
		}
		if got := [4]int64{int64(want.Allocs), int64(want.AllocBytes), int64(want.LiveCount()),
			int64(want.Live + want.HostLive)}; sum != got {
			t.Errorf("alloc_objects, alloc_space, inuse_objects, inuse_space = %v, want %v (ground truth)", sum, got)
		}
		// The default sample type totals the GPU memory live, host memory apart.
		if gpuLive != int64(want.Live) {
			t.Errorf("inuse_space totals %d, want the GPU live %d", gpuLive, want.Live)
		}
		if !found {
			t.Errorf("no location names alloc_device_buffer")
		}
		// As a user reads it: go tool pprof -top totals the report's GPU
		// live bytes, and -sample_index=host_inuse_space the pinned host memory.
		if got := pprofTopTotal(t, ctx, pb); got != want.Live {
			t.Errorf("go tool pprof -top totals %d bytes, want the GPU live %d", got, want.Live)
		}
		if got := pprofTopTotal(t, ctx, pb, "-sample_index=host_inuse_space"); got != want.HostLive {
			t.Errorf("go tool pprof -top -sample_index=host_inuse_space totals %d bytes, want the host live %d", got, want.HostLive)
		}
		if p.DefaultSampleType != "inuse_space" {
			t.Errorf("default sample type %q", p.DefaultSampleType)
		}
	})

	t.Run("memviz", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			skipOrFail(t, "no python3 to load the snapshot: %v", err)
		}
		memviztest.Check(t, snap, memviztest.Want{})
		// Sum the segments per device, checking that blocks tile them.
		out, err := exec.CommandContext(ctx, py, "-c", `
import json, pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
live = {}
for seg in s["segments"]:
    end = seg["address"]
    for b in seg["blocks"]:
        assert b["address"] == end, "blocks do not tile"
        end += b["size"]
    assert end == seg["address"] + seg["total_size"], "blocks do not cover the segment"
    live[seg["device"]] = live.get(seg["device"], 0) + seg["total_size"]
print(json.dumps({"live": live, "traces": len(s["device_traces"]),
    "allocs": sum(1 for tr in s["device_traces"] for e in tr if e["action"] == "alloc")}))
`, snap).CombinedOutput()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, out)
		}
		var got struct {
			Live   map[string]uint64
			Traces int
			Allocs uint64
		}
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, d := range want.DeviceList() {
			if g := got.Live[strconv.Itoa(d)]; g != want.Devices[d].Live {
				t.Errorf("device %d: segments hold %d bytes, ground truth live %d", d, g, want.Devices[d].Live)
			}
		}
		if n := want.DeviceList(); got.Traces != n[len(n)-1]+1 {
			t.Errorf("%d device traces, want one per device up to %d", got.Traces, n[len(n)-1])
		}
		if got.Allocs > want.Allocs || got.Allocs == 0 {
			t.Errorf("%d alloc entries, want the GPU allocations among the %d", got.Allocs, want.Allocs)
		}
	})

	t.Run("perfetto", func(t *testing.T) {
		data, err := os.ReadFile(timeline)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			TraceEvents []map[string]any `json:"traceEvents"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		// The last value of each device's track is its live bytes at the end.
		last := map[string]float64{}
		for _, e := range doc.TraceEvents {
			if e["ph"] == "C" {
				last[e["name"].(string)] = e["args"].(map[string]any)["live_bytes"].(float64)
			}
		}
		for _, d := range want.DeviceList() {
			name := fmt.Sprintf("GPU %d memory", d)
			if got, ok := last[name]; !ok || uint64(got) != want.Devices[d].Live {
				t.Errorf("%q ends at %v (present: %v), ground truth live %d", name, got, ok, want.Devices[d].Live)
			}
		}
		if got := last["pinned host memory"]; uint64(got) != want.HostLive {
			t.Errorf("pinned host memory ends at %v, ground truth %d", got, want.HostLive)
		}
	})

	t.Run("json", func(t *testing.T) {
		out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "json", "-o", "-").Output()
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Allocations []struct {
				Size uint64 `json:"size"`
				Kind string `json:"kind"`
			} `json:"allocations"`
		}
		if err := json.Unmarshal(out, &doc); err != nil {
			t.Fatal(err)
		}
		var gpu, host uint64
		for _, a := range doc.Allocations {
			if a.Kind == "host" {
				host += a.Size
			} else {
				gpu += a.Size
			}
		}
		if len(doc.Allocations) != want.LiveCount() || gpu != want.Live || host != want.HostLive {
			t.Errorf("%d live allocations, %d GPU bytes, %d host; ground truth %d, %d, %d",
				len(doc.Allocations), gpu, host, want.LiveCount(), want.Live, want.HostLive)
		}
	})

	t.Run("errors", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"export", trace, "-o", "x"}, "say which --format"},
			{[]string{"export", trace, "--format", "svg", "-o", "x"}, `unknown format "svg"`},
			{[]string{"export", trace, "--format", "pprof"}, "say where to write"},
			{[]string{"export", trace, "--format", "pprof", "--at", "soon", "-o", "x"}, "--at \"soon\""},
			{[]string{"record", "--export", "pprof", "--all"}, "want FORMAT=FILE"},
		} {
			out, err := exec.CommandContext(ctx, tracerBin, c.args...).CombinedOutput()
			if err == nil || !strings.Contains(string(out), c.want) || strings.Contains(string(out), "goroutine") {
				t.Errorf("%q: %v\n%s\nwant an error saying %q", c.args, err, out, c.want)
			}
		}
	})
}

var pprofTotalRE = regexp.MustCompile(`Showing nodes accounting for \d+B, [\d.]+% of (\d+)B total`)

// pprofTopTotal is the total `go tool pprof -top` shows for the profile at
// path, in bytes, as a user reads it.
func pprofTopTotal(t *testing.T, ctx context.Context, path string, args ...string) uint64 {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(os.Getenv("GOROOT"), "bin", "go") // as the test's own build finds it
	}
	out, err := exec.CommandContext(ctx, goTool, append(append([]string{"tool", "pprof", "-top", "-unit=B"}, args...), path)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	m := pprofTotalRE.FindSubmatch(out)
	if m == nil {
		t.Fatalf("go tool pprof -top printed no total:\n%s", out)
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return n
}
