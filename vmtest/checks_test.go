package vmtest

// Unit tests of the report checks themselves, on a synthetic log and
// synthetic reports: a right report passes, and each kind of wrong one is
// caught. No privileges, no tools.

import (
	"encoding/json"
	"strings"
	"testing"
)

const syntheticLog = `cudaSetDevice pid=100 tid=100 ret=0 ptr=0x0 size=0 dev=1 kind=none req=0
cudaMalloc pid=100 tid=100 ret=0 ptr=0x7e1000000000 size=1000 dev=1 kind=device req=1000
cudaMallocHost pid=100 tid=101 ret=0 ptr=0x7c0000000000 size=64 dev=0 kind=host req=64
cudaMallocManaged pid=100 tid=101 ret=0 ptr=0x7d0000000000 size=300 dev=0 kind=managed req=300
cudaMalloc pid=100 tid=101 ret=2 ptr=0x0 size=0 dev=0 kind=device req=99999999999
cudaMallocPitch pid=100 tid=101 ret=1 ptr=0x0 size=0 dev=0 kind=device req=0
cudaFree pid=100 tid=100 ret=0 ptr=0x7e1000000000 size=1000 dev=1 kind=device req=0
cudaFree pid=100 tid=100 ret=1 ptr=0x10000 size=0 dev=1 kind=device req=0
cudaFree pid=100 tid=100 ret=0 ptr=0x0 size=0 dev=1 kind=device req=0
cudaMalloc pid=100 tid=100 ret=0 ptr=0x7e1000000000 size=512 dev=1 kind=device req=512
cudaMalloc pid=200 tid=200 ret=0 ptr=0x7e0000000000 size=7 dev=0 kind=device req=7
`

const syntheticReport = `{
 "lost_events": 0,
 "processes": [
  {"pid": 100, "comm": "mix", "allocs": 4, "frees": 1, "failed": 2, "alloc_bytes": 1876,
   "live_bytes": 812, "peak_bytes": 1300, "host_live_bytes": 64,
   "devices": [{"device": 0, "live_bytes": 300, "peak_bytes": 300}, {"device": 1, "live_bytes": 512, "peak_bytes": 1000}]},
  {"pid": 200, "comm": "other", "allocs": 1, "frees": 0, "failed": 0, "alloc_bytes": 7,
   "live_bytes": 7, "peak_bytes": 7, "host_live_bytes": 0,
   "devices": [{"device": 0, "live_bytes": 7, "peak_bytes": 7}]}
 ],
 "stacks": [
  {"pid": 100, "allocs": 3, "alloc_bytes": 1812, "live_bytes": 812, "frames": [
    {"function": "alloc_device_buffer", "file": "/src/mix.c", "line": 120, "module": "/b/mix"},
    {"function": "alloc_step", "file": "/src/mix.c", "line": 240, "module": "/b/mix"},
    {"function": "worker_main", "file": "/src/mix.c", "line": 300, "module": "/b/mix"},
    {"function": "start_thread", "file": "", "line": 0, "module": "/lib/x86_64-linux-gnu/libc.so.6"}]},
  {"pid": 100, "allocs": 1, "alloc_bytes": 64, "live_bytes": 64, "frames": [
    {"function": "alloc_pinned_staging", "file": "/src/mix.c", "line": 150, "module": "/b/mix"}]}
 ],
 "failures": [
  {"pid": 100, "tid": 101, "api": "cudaMalloc", "size": 99999999999, "device": 0, "result": 2, "error": "cudaErrorMemoryAllocation"},
  {"pid": 100, "tid": 101, "api": "cudaMallocPitch", "size": 0, "device": 0, "result": 1, "error": "cudaErrorInvalidValue"}
 ]
}`

func syntheticTruth(t *testing.T) map[int]*procTruth {
	t.Helper()
	calls, err := parseLog(strings.NewReader(syntheticLog))
	if err != nil {
		t.Fatal(err)
	}
	truths, err := groundTruth(calls, "")
	if err != nil {
		t.Fatal(err)
	}
	return truths
}

// mutate decodes the synthetic report into generic JSON, applies f, and
// decodes the result as a report.
func mutate(t *testing.T, f func(m map[string]any)) (*report, error) {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(syntheticReport), &m); err != nil {
		t.Fatal(err)
	}
	f(m)
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return decodeReport(data)
}

func proc0(m map[string]any) map[string]any {
	return m["processes"].([]any)[0].(map[string]any)
}

func TestReportChecks(t *testing.T) {
	truths := syntheticTruth(t)
	want := truths[100]
	if want.Allocs != 4 || want.Frees != 1 || want.Failed != 2 || want.AllocBytes != 1876 || want.Live != 812 ||
		want.Peak != 1300 || want.HostLive != 64 || want.Devices[1].Peak != 1000 || want.NullFrees != 1 || want.FailedFrees != 1 {
		t.Fatalf("synthetic truth: %v", want)
	}

	rep, err := decodeReport([]byte(syntheticReport))
	if err != nil {
		t.Fatal(err)
	}
	if p := diffProcess(rep, want, 0, "mix"); len(p) != 0 {
		t.Errorf("a right report: %q", p)
	}
	if p := diffStacks(rep, 100, "/b/mix", "alloc_device_buffer", "worker_main"); len(p) != 0 {
		t.Errorf("right stacks: %q", p)
	}

	cases := []struct {
		name  string
		slack uint64
		f     func(m map[string]any)
		want  string // a problem containing this
	}{
		{"live", 0, func(m map[string]any) { proc0(m)["live_bytes"] = 813 }, "live_bytes = 813, want 812"},
		{"frees", 0, func(m map[string]any) { proc0(m)["frees"] = 2 }, "frees = 2, want 1"},
		{"host", 0, func(m map[string]any) { proc0(m)["host_live_bytes"] = 0 }, "host_live_bytes = 0, want 64"},
		{"peak", 0, func(m map[string]any) { proc0(m)["peak_bytes"] = 1301 }, "peak_bytes = 1301, want 1300 (within 0)"},
		{"peak in slack", 10, func(m map[string]any) { proc0(m)["peak_bytes"] = 1310 }, ""},
		{"peak past slack", 10, func(m map[string]any) { proc0(m)["peak_bytes"] = 1289 }, "peak_bytes = 1289"},
		{"comm", 0, func(m map[string]any) { proc0(m)["comm"] = "mux" }, `comm "mux"`},
		{"device missing", 0, func(m map[string]any) {
			proc0(m)["devices"] = proc0(m)["devices"].([]any)[1:]
		}, "device 0 missing"},
		{"device live", 0, func(m map[string]any) {
			proc0(m)["devices"].([]any)[1].(map[string]any)["live_bytes"] = 0
		}, "device 1 live_bytes = 0, want 512"},
		{"extra device", 0, func(m map[string]any) {
			proc0(m)["devices"] = append(proc0(m)["devices"].([]any), map[string]any{"device": 3, "live_bytes": 1, "peak_bytes": 1})
		}, "device 3 has live 1"},
		{"error name", 0, func(m map[string]any) {
			m["failures"].([]any)[0].(map[string]any)["error"] = "cudaErrorInvalidValue"
		}, `error "cudaErrorInvalidValue", want "cudaErrorMemoryAllocation"`},
		{"failure size", 0, func(m map[string]any) {
			m["failures"].([]any)[0].(map[string]any)["size"] = 1
		}, "failures differ"},
		{"pitch failure size is not compared", 0, func(m map[string]any) {
			m["failures"].([]any)[1].(map[string]any)["size"] = 12345
		}, ""},
		{"failure device", 0, func(m map[string]any) {
			m["failures"].([]any)[1].(map[string]any)["device"] = 1
		}, "failures differ"},
		{"failure tid", 0, func(m map[string]any) {
			m["failures"].([]any)[1].(map[string]any)["tid"] = 102
		}, "tid 102 made no call"},
		{"failure missing", 0, func(m map[string]any) { m["failures"] = m["failures"].([]any)[:1] }, "failures by error name"},
		{"process missing", 0, func(m map[string]any) { m["processes"] = m["processes"].([]any)[1:] }, "not in the report"},
	}
	for _, c := range cases {
		rep, err := mutate(t, c.f)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		probs := diffProcess(rep, want, c.slack, "mix")
		if c.want == "" {
			if len(probs) != 0 {
				t.Errorf("%s: unexpected problems %q", c.name, probs)
			}
			continue
		}
		if !strings.Contains(strings.Join(probs, "\n"), c.want) {
			t.Errorf("%s: problems %q lack %q", c.name, probs, c.want)
		}
	}

	// Stacks.
	if p := diffStacks(rep, 100, "/b/mix", "alloc_device_buffer", "main"); len(p) != 1 || !strings.Contains(p[0], "no stack holds") {
		t.Errorf("a function in no stack: %q", p)
	}
	if p := diffStacks(rep, 100, "/other/mix", "alloc_device_buffer"); len(p) != 1 {
		t.Errorf("a stack in another module: %q", p)
	}
	noLine, _ := mutate(t, func(m map[string]any) {
		m["stacks"].([]any)[0].(map[string]any)["frames"].([]any)[2].(map[string]any)["line"] = 0
	})
	if p := diffStacks(noLine, 100, "/b/mix", "alloc_device_buffer", "worker_main"); len(p) != 1 || !strings.Contains(p[0], "want file mix.c and a line") {
		t.Errorf("a frame without a line: %q", p)
	}
	tooMany, _ := mutate(t, func(m map[string]any) { m["stacks"].([]any)[1].(map[string]any)["allocs"] = 5 })
	if p := diffStacks(tooMany, 100, "/b/mix", "alloc_pinned_staging"); len(p) != 1 || !strings.Contains(p[0], "stacks add up") {
		t.Errorf("stacks with more allocations than the process: %q", p)
	}

	// Missing keys are errors, not zeros.
	for _, del := range []func(m map[string]any){
		func(m map[string]any) { delete(m, "lost_events") },
		func(m map[string]any) { delete(proc0(m), "host_live_bytes") },
		func(m map[string]any) { delete(proc0(m)["devices"].([]any)[0].(map[string]any), "peak_bytes") },
		func(m map[string]any) {
			delete(m["stacks"].([]any)[0].(map[string]any)["frames"].([]any)[0].(map[string]any), "module")
		},
		func(m map[string]any) { delete(m["failures"].([]any)[0].(map[string]any), "error") },
	} {
		if _, err := mutate(t, del); err == nil || !strings.Contains(err.Error(), "lacks") {
			t.Errorf("a report missing a key decoded: %v", err)
		}
	}
}

func TestGroundTruthMarker(t *testing.T) {
	log := `cudaMalloc pid=1 tid=1 ret=0 ptr=0x1000 size=100 dev=0 kind=device req=100
cudaMalloc pid=2 tid=2 ret=0 ptr=0x1000 size=5 dev=0 kind=device req=5
PHASE2 pid=1 tid=1 ret=0 ptr=0x0 size=0 dev=0 kind=none req=0
cudaFree pid=1 tid=1 ret=0 ptr=0x1000 size=100 dev=0 kind=device req=0
cudaMalloc pid=1 tid=1 ret=0 ptr=0x1000 size=200 dev=0 kind=device req=200
cudaMallocHost pid=1 tid=1 ret=0 ptr=0x2000 size=10 dev=0 kind=host req=10
`
	calls, err := parseLog(strings.NewReader(log))
	if err != nil {
		t.Fatal(err)
	}
	truths, err := groundTruth(calls, "PHASE2")
	if err != nil {
		t.Fatal(err)
	}
	if len(truths) != 1 {
		t.Fatalf("pids %v: a process without the marker counts nothing", keys(truths))
	}
	p := truths[1]
	if p.Allocs != 2 || p.Frees != 0 || p.UnknownFrees != 1 || p.Live != 200 || p.Peak != 200 || p.HostLive != 10 {
		t.Errorf("after the marker: %v", p)
	}
	// Without the marker the same log is a whole run.
	if truths, err = groundTruth(calls, ""); err != nil || truths[1].Frees != 1 || truths[1].Peak != 200 || len(truths) != 2 {
		t.Errorf("whole run: %v %v", truths, err)
	}

	// A log that contradicts itself is an error.
	for _, bad := range []string{
		"cudaMalloc pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=device req=1\ncudaMalloc pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=device req=1\n",
		"cudaFree pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=device req=0\n",
		"cudaMalloc pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=host req=1\n",
		"cudaMallocHost pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=host req=1\ncudaFree pid=1 tid=1 ret=0 ptr=0x1000 size=1 dev=0 kind=host req=0\n",
	} {
		calls, err := parseLog(strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := groundTruth(calls, ""); err == nil {
			t.Errorf("no error for %q", bad)
		}
	}
	if _, err := parseLog(strings.NewReader("cudaMalloc pid=1 tid=x\n")); err == nil {
		t.Errorf("a malformed line parsed")
	}
}
