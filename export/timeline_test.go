package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

type traceEvent struct {
	Ph   string         `json:"ph"`
	Name string         `json:"name"`
	PID  uint32         `json:"pid"`
	TID  uint32         `json:"tid"`
	TS   float64        `json:"ts"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

func TestPerfetto(t *testing.T) {
	items := memvizItems()
	// A lost free: an allocation at a live address on the same device is
	// one step of its counter.
	items = append(items[:len(items)-1], events.Event{Time: memvizBase + 6500, Duration: 10, PID: 7, TID: 7,
		Comm: "train", API: events.CudaMalloc, Addr: 0x7200_0000, Size: 100, Device: 0},
		&tracefile.End{Time: memvizBase + 7000})
	path, _ := tracetest.Write(t, memvizMeta(), items...)
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, path, Options{}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		DisplayTimeUnit string       `json:"displayTimeUnit"`
		TraceEvents     []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, buf.String())
	}
	type step struct {
		ts   float64
		live float64
	}
	counters := map[string][]step{} // "pid/name"
	var names, threads []string
	var instants []traceEvent
	for _, e := range doc.TraceEvents {
		ph := e.Ph
		if ph == "M" {
			ph += e.Name
		}
		switch ph {
		case "C":
			key := string(rune('0'+e.PID-7)) + "/" + e.Name
			counters[key] = append(counters[key], step{e.TS, e.Args["live_bytes"].(float64)})
		case "M" + "process_name":
			names = append(names, e.Args["name"].(string))
		case "M" + "thread_name":
			threads = append(threads, fmt.Sprintf("%d/%d %s", e.PID, e.TID, e.Args["name"]))
		case "i":
			instants = append(instants, e)
		default:
			t.Errorf("event of phase %q: %+v", e.Ph, e)
		}
	}
	want := map[string][]step{
		"0/GPU 0 memory":       {{1.010, 2 << 20}, {3.000, 0}, {5.010, 4096}, {6.510, 100}},
		"0/GPU 1 memory":       {{2.010, 512}},
		"0/pinned host memory": {{2.510, 64}},
		"1/GPU 0 memory":       {{6.010, 100}},
	}
	if !reflect.DeepEqual(counters, want) {
		t.Errorf("counters\n got %v\nwant %v", counters, want)
	}
	if !reflect.DeepEqual(names, []string{"train (7)", "train (8)"}) {
		t.Errorf("process names %q", names)
	}
	// The failures' thread is named, and each failure is an instant on it
	// with its stack.
	if !reflect.DeepEqual(threads, []string{"7/7 train (7)"}) {
		t.Errorf("thread names %q", threads)
	}
	if len(instants) != 2 {
		t.Fatalf("instant events %+v, want the two failures", instants)
	}
	oom := instants[0]
	if st, _ := oom.Args["stack"].([]any); len(st) != 1 || st[0] != "0xa1" {
		t.Errorf("oom stack %v, want [0xa1]", oom.Args["stack"])
	}
	if oom.Name != "cudaMalloc failed: cudaErrorMemoryAllocation" || oom.S != "t" || oom.PID != 7 || oom.TS != 4.010 ||
		oom.Args["size"] != float64(1<<40) || oom.Args["device"] != 1.0 || oom.Args["error"] != "cudaErrorMemoryAllocation" {
		t.Errorf("oom event %+v", oom)
	}
	if instants[1].Args["error"] != "cudaErrorInvalidValue" {
		t.Errorf("second failure %+v", instants[1])
	}
	if doc.DisplayTimeUnit != "ms" {
		t.Errorf("displayTimeUnit %q", doc.DisplayTimeUnit)
	}

	// --pid keeps one process's tracks.
	buf.Reset()
	if err := WritePerfetto(&buf, path, Options{PIDs: []uint32{8}}); err != nil {
		t.Fatal(err)
	}
	doc.TraceEvents = nil
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, e := range doc.TraceEvents {
		if e.PID != 8 {
			t.Errorf("--pid 8 exports %+v", e)
		}
	}
}

// Events reach the file in ring-buffer order: a free from another CPU can
// follow an allocation that came after it. Every counter's timestamps must
// still rise, and its last value be the live total at the end.
func TestPerfettoOutOfOrder(t *testing.T) {
	ev := func(tm uint64, tid uint32, api events.API, addr, size uint64) events.Event {
		e := events.Event{Time: memvizBase + tm, Duration: 10, PID: 7, TID: tid, Comm: "train", API: api,
			Addr: addr, Size: size}
		if api == events.CudaFree {
			e.Duration, e.Flags = 0, events.FlagEntryOnly
		}
		return e
	}
	path, _ := tracetest.Write(t, memvizMeta(),
		ev(1000, 7, events.CudaMalloc, 0x1000, 100),
		ev(3000, 8, events.CudaMalloc, 0x2000, 50),
		ev(2000, 9, events.CudaFree, 0x1000, 0), // written after the allocation that followed it
		ev(4000, 7, events.CudaMalloc, 0x3000, 25),
		&tracefile.End{Time: memvizBase + 5000})
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, path, Options{}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, buf.String())
	}
	type step struct{ ts, live float64 }
	var got []step
	for _, e := range doc.TraceEvents {
		if e.Ph == "C" && e.Name == "GPU 0 memory" {
			got = append(got, step{e.TS, e.Args["live_bytes"].(float64)})
		}
	}
	// The late free takes the time of the value before it.
	want := []step{{1.010, 100}, {3.010, 150}, {3.010, 50}, {4.010, 75}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 0 memory\n got %v\nwant %v", got, want)
	}
}

// Tensors have tracks of their own, and pprof labels them level=tensor.
func TestTensorLevelExports(t *testing.T) {
	ev := func(tm uint64, api events.API, addr, size uint64) events.Event {
		e := events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size,
			Flags: events.FlagEntryOnly, Stack: []uint64{0x10}}
		return e
	}
	path, _ := tracetest.Write(t, memvizMeta(),
		ev(1000, events.CudaMalloc, 0x1000, 4096),
		ev(2000, events.TorchMalloc, 0x1000, 100),
		ev(3000, events.TorchMalloc, 0x1100, 50),
		ev(4000, events.TorchFree, 0x1000, 0),
		&tracefile.End{Time: memvizBase + 5000})
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, path, Options{}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	tracks := map[string][]float64{}
	for _, e := range doc.TraceEvents {
		if e.Ph == "C" {
			tracks[e.Name] = append(tracks[e.Name], e.Args["live_bytes"].(float64))
		}
	}
	want := map[string][]float64{"GPU 0 memory": {4096}, "GPU 0 tensors": {100, 150, 50}}
	if !reflect.DeepEqual(tracks, want) {
		t.Errorf("tracks %v, want %v", tracks, want)
	}

	buf.Reset()
	if err := WritePprof(&buf, path, Options{NoSymbolize: true}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	// Segments in inuse_space (3), tensors in tensor_inuse_space (7):
	// never both, so the default total is not counted twice.
	inuse := map[string]int64{}
	for _, s := range p.Sample {
		switch s.Label["level"][0] {
		case "tensor":
			inuse["tensor"] += s.Value[7]
			inuse["tensor in inuse_space"] += s.Value[3]
		default:
			inuse["segment"] += s.Value[3]
		}
	}
	if want := map[string]int64{"segment": 4096, "tensor": 50, "tensor in inuse_space": 0}; !reflect.DeepEqual(inuse, want) {
		t.Errorf("inuse_space by level %v, want %v", inuse, want)
	}
}

// TestImplicitFreeExports: a context dies holding two allocations and the
// driver hands one address out again. The Perfetto timeline marks the
// death with one instant event (count and bytes) and its counter drops to
// the survivor; the memviz export succeeds (the freed segment does not
// overlap its reuse).
func TestImplicitFreeExports(t *testing.T) {
	const ctx = 0xc7c1000
	ev := func(tm uint64, api events.API, addr, size uint64) events.Event {
		return events.Event{Time: memvizBase + tm, Duration: 10, PID: 7, TID: 7, Comm: "train", API: api,
			Addr: addr, Size: size, Device: 0, Stack: []uint64{0x401000}}
	}
	ctxEv := func(tm uint64, api events.API, handle, after uint64) events.Event {
		return events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: api, Addr: handle,
			Size: after, Device: 0, Flags: events.FlagEntryOnly}
	}
	items := []any{
		ev(100, events.CuMemAlloc, 0x7000_0000, 1000), // before the context: the runtime's
		ctxEv(200, events.CuCtxCreate, ctx, ctx),
		ev(300, events.CuMemAlloc, 0x7100_0000, 4096),
		ev(400, events.CuMemAlloc, 0x7200_0000, 512),
		ctxEv(500, events.CuCtxDestroy, ctx, 0),
		ev(600, events.CuMemAlloc, 0x7100_0000, 2048), // the address again
		&tracefile.End{Time: memvizBase + 700},
	}
	path, _ := tracetest.Write(t, memvizMeta(), items...)
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, path, Options{}); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, buf.String())
	}
	var instants []traceEvent
	var live []float64
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "i":
			instants = append(instants, e)
		case "C":
			live = append(live, e.Args["live_bytes"].(float64))
		}
	}
	if len(instants) != 1 || instants[0].Name != "cuCtxDestroy_v2: 2 allocations (4.5 KiB) freed with their context" ||
		instants[0].Args["implicit_free_bytes"] != float64(4608) || instants[0].Args["context"] != "0xc7c1000" {
		t.Errorf("instant events %+v, want one for the context's death", instants)
	}
	if want := []float64{1000, 5096, 5608, 1000, 3048}; !reflect.DeepEqual(live, want) {
		t.Errorf("live_bytes steps %v, want %v", live, want)
	}
	buf.Reset()
	if err := WriteMemvizTrace(&buf, path, Options{}); err != nil {
		t.Fatalf("memviz export after an implicit free and reuse: %v", err)
	}
}
