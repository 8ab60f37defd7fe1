package export

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// fakeStacks names frame 0xN "fnN" in /bin/w, mapped at 0..0x10000.
type fakeStacks struct{}

var fakeMap = proc.Mapping{Start: 0, End: 0x10000, Path: "/bin/w", BuildID: "abcd"}

func (fakeStacks) Maps(*ledger.Stack) []proc.Mapping { return []proc.Mapping{fakeMap} }
func (fakeStacks) Frames(st *ledger.Stack) []symbolize.Frame {
	out := make([]symbolize.Frame, len(st.Frames))
	for i, pc := range st.Frames {
		out[i] = symbolize.Frame{Addr: pc, Function: fmt.Sprintf("fn%x", pc), File: "w.c", Line: int(pc), Module: "/bin/w"}
	}
	return out
}

func TestWriteLivePprof(t *testing.T) {
	l := ledger.New()
	ev := func(pid uint32, api events.API, addr, size uint64, frames ...uint64) {
		l.Apply(&events.Event{PID: pid, TID: pid, Comm: "job", API: api, Addr: addr, Size: size, Stack: frames})
	}
	ev(1, events.CudaMalloc, 0x1000, 100, 0xa, 0xb)
	ev(1, events.CudaMalloc, 0x2000, 50, 0xa, 0xb)
	ev(2, events.CudaMalloc, 0x1000, 7, 0xc)
	st1 := l.StackOf(1, []uint64{0xa, 0xb}, false)
	st2 := l.StackOf(2, []uint64{0xc}, false)
	lp := &LiveProfile{
		Samples: Samples{
			{Stack: st2, API: events.CudaMalloc}: {0, 0, 1, 7},
			{Stack: st1, API: events.CudaMalloc}: {1, 50, 2, 150},
		},
		Comm:     map[uint32]string{1: "job", 2: "other"},
		Labels:   map[uint32]map[string]string{1: {"container": "c0ffee", "pod": ""}},
		Time:     time.Unix(1700000000, 0),
		Duration: 15 * time.Second,
		Comment:  "live",
	}
	var buf bytes.Buffer
	if err := WriteLivePprof(&buf, lp, fakeStacks{}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sample) != 2 || p.DurationNanos != int64(15*time.Second) || p.TimeNanos != lp.Time.UnixNano() {
		t.Fatalf("profile: %d samples, duration %d, time %d", len(p.Sample), p.DurationNanos, p.TimeNanos)
	}
	// Sorted by PID: pid 1 first.
	s := p.Sample[0]
	if fmt.Sprint(s.Value) != "[1 50 2 150 0 0 0 0 0 0 0 0]" || s.NumLabel["pid"][0] != 1 || s.Label["container"][0] != "c0ffee" ||
		s.Label["comm"][0] != "job" || s.Label["level"][0] != "segment" || s.Label["device"][0] != "0" {
		t.Errorf("pid 1's sample: values %v labels %v %v", s.Value, s.Label, s.NumLabel)
	}
	if _, ok := s.Label["pod"]; ok {
		t.Errorf("an empty pod label was written: %v", s.Label)
	}
	if len(s.Location) != 2 || s.Location[0].Line[0].Function.Name != "fna" || s.Location[1].Line[0].Function.Name != "fnb" ||
		s.Location[0].Mapping.BuildID != "abcd" {
		t.Errorf("pid 1's stack: %v", s.Location)
	}
	s = p.Sample[1]
	if fmt.Sprint(s.Value) != "[0 0 1 7 0 0 0 0 0 0 0 0]" || s.Label["comm"][0] != "other" || s.Label["container"] != nil {
		t.Errorf("pid 2's sample: values %v labels %v", s.Value, s.Label)
	}
}

func TestLiveSnapshot(t *testing.T) {
	l := ledger.New()
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Device: 1, Stack: []uint64{0xa}})
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.CudaMallocHost, Addr: 0x90000, Size: 64, Stack: []uint64{0xb}})
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.TorchMalloc, Addr: 0x10200, Size: 1000, Device: 1, Stack: []uint64{0xc}})
	p := l.Process(1)
	oom := l.StackOf(1, []uint64{0xa}, false)
	snap, err := LiveSnapshot(p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true,
		[]LiveEntry{{Action: MemvizOOM, Size: 1 << 40, Device: 1, Stack: oom, TimeUS: 5}}, fakeStacks{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Segments) != 1 {
		t.Fatalf("%d segments, want 1 (host memory left out)", len(snap.Segments))
	}
	seg := snap.Segments[0]
	if seg.Device != 1 || seg.Address != 0x10000 || seg.TotalSize != 4096 || seg.AllocatedSize != 1024 || len(seg.Blocks) != 3 {
		t.Errorf("segment %+v", seg)
	}
	if b := seg.Blocks[1]; b.Address != 0x10200 || b.Size != 1024 || b.RequestedSize != 1000 || b.Frames[0].Name != "fnc" {
		t.Errorf("tensor block %+v", b)
	}
	if len(snap.DeviceTraces) != 2 || len(snap.DeviceTraces[1]) != 1 || snap.DeviceTraces[1][0].Action != MemvizOOM ||
		snap.DeviceTraces[1][0].Frames[0].Name != "fna" {
		t.Errorf("device traces %+v", snap.DeviceTraces)
	}
	var buf bytes.Buffer
	if err := WriteMemviz(&buf, snap); err != nil {
		t.Fatal(err)
	}
}

// TestPprofContainerLabels: a trace's process frames name its container
// and pod, and the profile of the trace carries them as labels.
func TestPprofContainerLabels(t *testing.T) {
	const id = "3f4e1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	path, _ := tracetest.Write(t, memvizMeta(),
		&tracefile.Process{PID: 7, Comm: "job", Time: memvizBase, Container: id, Pod: "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"},
		&tracefile.Process{PID: 8, Comm: "host", Time: memvizBase},
		events.Event{Time: memvizBase + 1, PID: 7, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 10, Stack: []uint64{1}},
		events.Event{Time: memvizBase + 2, PID: 8, Comm: "host", API: events.CudaMalloc, Addr: 0x1000, Size: 20, Stack: []uint64{1}},
		&tracefile.End{Time: memvizBase + 3})
	var buf bytes.Buffer
	if err := WritePprof(&buf, path, Options{NoSymbolize: true}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Sample) != 2 {
		t.Fatalf("%d samples, want 2", len(p.Sample))
	}
	if l := p.Sample[0].Label; l["container"][0] != id || l["pod"][0] != "7c5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b" {
		t.Errorf("pid 7's labels %v", l)
	}
	if l := p.Sample[1].Label; l["container"] != nil || l["pod"] != nil {
		t.Errorf("pid 8 (on the host) has labels %v", l)
	}
}

// The agent attached after the process made its segments: a live tensor in
// a segment it never saw gets a segment of its own rather than being
// dropped, and the snapshot file passes memory_viz's walk.
func TestLiveSnapshotUnseenSegment(t *testing.T) {
	l := ledger.New()
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Stack: []uint64{0xa}})
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.TorchMalloc, Addr: 0x10200, Size: 1000, Stack: []uint64{0xc}})
	l.Apply(&events.Event{PID: 1, Comm: "job", API: events.TorchMalloc, Addr: 0x80000, Size: 2_500_000, Stack: []uint64{0xc}})
	p := l.Process(1)
	snap, err := LiveSnapshot(p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true, nil, fakeStacks{})
	if err != nil {
		t.Fatal(err)
	}
	var allocated uint64
	for _, s := range snap.Segments {
		allocated += s.AllocatedSize
	}
	if len(snap.Segments) != 2 || allocated != 1024+2_500_000 {
		t.Errorf("%d segments holding %d bytes of tensors, want 2 holding %d", len(snap.Segments), allocated, 1024+2_500_000)
	}
	if s := snap.Segments[1]; s.Address != 0x80000 || s.TotalSize != 2_500_000 {
		t.Errorf("the unseen segment's tensor: segment %#x+%d", s.Address, s.TotalSize)
	}
	checkViewer(t, snap)
}

// pyStacks names frames as a CPython process's merged stacks: 0xa is
// ctypes' native call, the others Python frames with names pprof's
// default demangling would simplify.
type pyStacks struct{}

func (pyStacks) Maps(*ledger.Stack) []proc.Mapping { return []proc.Mapping{fakeMap} }
func (pyStacks) Frames(st *ledger.Stack) []symbolize.Frame {
	names := map[uint64]string{0xa: "_ctypes_callproc", 1<<63 | 1: "<listcomp>", 1<<63 | 2: "<module>", 1<<63 | 3: "Model.<lambda>"}
	out := make([]symbolize.Frame, len(st.Frames))
	for i, pc := range st.Frames {
		out[i] = symbolize.Frame{Addr: pc, Function: names[pc], File: "/srv/train.py", Line: 10 + i, Module: pystack.Module}
		if pc == 0xa {
			out[i].File, out[i].Module = "callproc.c", "/bin/w"
		}
	}
	return out
}

// go tool pprof -top, with its default options, shows a Python program's
// <module>, <listcomp> and <lambda> frames by name: pprof simplifies the
// names of functions whose SystemName is their Name, dropping what stands
// between < and >, and they came out as <unknown>.
func TestPprofPythonNames(t *testing.T) {
	l := ledger.New()
	frames := []uint64{0xa, 1<<63 | 3, 1<<63 | 1, 1<<63 | 2}
	l.Apply(&events.Event{PID: 1, TID: 1, Comm: "py", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Stack: frames})
	st := l.StackOf(1, frames, false)
	lp := &LiveProfile{Samples: Samples{{Stack: st, API: events.CudaMalloc}: {1, 100, 1, 100}},
		Comm: map[uint32]string{1: "py"}, Time: time.Unix(1700000000, 0), Duration: time.Second}
	file := filepath.Join(t.TempDir(), "py.pb.gz")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteLivePprof(f, lp, pyStacks{}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	goTool := testenv.LookPath(t, "go")
	out, err := exec.Command(goTool, "tool", "pprof", "-top", "-cum", file).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	for _, w := range []string{" <module>\n", " <listcomp>\n", " Model.<lambda>\n", " _ctypes_callproc\n"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("go tool pprof -top lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(string(out), "<unknown>") {
		t.Errorf("go tool pprof -top shows <unknown>:\n%s", out)
	}
}

// checkViewer writes snap as a pickle and reads it as PyTorch's viewer does
// (memviztest.Check).
func checkViewer(t *testing.T, snap *Snapshot) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "snapshot.pickle")
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	err = WriteMemviz(f, snap)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	memviztest.Check(t, out, memviztest.Want{})
}
