package export

import (
	"testing"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
)

// The OTLP form of a profile holds, per process, the same totals, stacks
// and labels as the pprof one, with the process's labels on its resource.
func TestOTLPFromPprof(t *testing.T) {
	fn := &profile.Function{ID: 1, Name: "Model.forward", SystemName: "m.py:Model.forward", Filename: "m.py"}
	fn2 := &profile.Function{ID: 2, Name: "cudaMalloc", SystemName: "cudaMalloc"}
	m := &profile.Mapping{ID: 1, Start: 0x1000, Limit: 0x9000, File: "/lib/libcudart.so.12", BuildID: "abcd"}
	l1 := &profile.Location{ID: 1, Mapping: m, Address: 0x1234, Line: []profile.Line{{Function: fn2}}}
	l2 := &profile.Location{ID: 2, Line: []profile.Line{{Function: fn, Line: 42}}}
	p := &profile.Profile{SampleType: pprofSampleTypes, PeriodType: &profile.ValueType{Type: "space", Unit: "bytes"}, Period: 1,
		Function: []*profile.Function{fn, fn2}, Mapping: []*profile.Mapping{m}, Location: []*profile.Location{l1, l2}, TimeNanos: 1e18}
	vals := func(allocN, alloc, liveN, live int64) []int64 {
		v := make([]int64, len(pprofSampleTypes))
		v[0], v[1], v[2], v[3] = allocN, alloc, liveN, live
		return v
	}
	p.Sample = []*profile.Sample{
		{Location: []*profile.Location{l1, l2}, Value: vals(2, 2048, 1, 1024), NumLabel: map[string][]int64{"pid": {10}},
			Label: map[string][]string{"comm": {"python3"}, "device": {"0"}, "api": {"cudaMalloc"}, "pod": {"train-0"},
				"namespace": {"ml"}, "rank": {"3"}, "job_id": {"j1"}, "level": {"segment"}, "owner": {"application"}}},
		{Location: []*profile.Location{l1}, Value: vals(1, 512, 0, 0), NumLabel: map[string][]int64{"pid": {10}},
			Label: map[string][]string{"comm": {"python3"}, "device": {"1"}, "api": {"cudaMalloc"}, "pod": {"train-0"},
				"namespace": {"ml"}, "rank": {"3"}, "job_id": {"j1"}}},
		{Location: []*profile.Location{l1}, Value: vals(0, 0, 5, 5000), NumLabel: map[string][]int64{"pid": {20}},
			Label: map[string][]string{"comm": {"host-job"}, "device": {"0"}, "api": {"cudaMalloc"}}},
	}
	pd, err := OTLPFromPprof(p, OTLPOptions{Resource: map[string]string{"host.name": "node-a"},
		GPU: func(d string) string { return map[string]string{"0": "GPU-aaaa"}[d] }})
	if err != nil {
		t.Fatal(err)
	}
	// Through the wire format, as a Collector reads it.
	b, err := pprofileotlp.NewExportRequestFromProfiles(pd).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	req := pprofileotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		t.Fatal(err)
	}
	pd = req.Profiles()
	if n := pd.ResourceProfiles().Len(); n != 2 {
		t.Fatalf("%d resources, want one per process", n)
	}
	got := OTLPTotals(pd)
	want := map[int64]map[string]int64{
		10: {"alloc_objects": 3, "alloc_space": 2560, "inuse_objects": 1, "inuse_space": 1024},
		20: {"inuse_objects": 5, "inuse_space": 5000},
	}
	for pid, w := range want {
		for k, v := range w {
			if got[pid].Values[k] != v {
				t.Errorf("pid %d %s = %d, want %d", pid, k, got[pid].Values[k], v)
			}
		}
		if len(got[pid].Values) != len(w) {
			t.Errorf("pid %d: sample types %v, want %v", pid, got[pid].Values, w)
		}
	}
	r := got[10].Resource
	for k, v := range map[string]string{"host.name": "node-a", "process.executable.name": "python3", "k8s.pod.name": "train-0",
		"k8s.namespace.name": "ml", "cudatrace.job.id": "j1", "cudatrace.job.rank": "3", "process.pid": "10"} {
		if r[k] != v {
			t.Errorf("resource %s = %q, want %q (%v)", k, r[k], v, r)
		}
	}
	if _, ok := got[20].Resource["k8s.pod.name"]; ok {
		t.Errorf("a host process named by a pod: %v", got[20].Resource)
	}
	// The stack, innermost first, and the sample's own attributes.
	st := got[10].Stacks["inuse_space"]
	if len(st) != 1 || st[0].Frames != "cudaMalloc;Model.forward:42" || st[0].Attrs["hw.id"] != "GPU-aaaa" ||
		st[0].Attrs["device"] != "0" || st[0].Attrs["owner"] != "application" {
		t.Errorf("pid 10's inuse_space samples: %+v", st)
	}
}
