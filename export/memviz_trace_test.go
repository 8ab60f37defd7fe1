package export

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

const memvizBase = 5_000_000_000 // boot ns at the start of the test traces

func memvizMeta() tracefile.Meta {
	return tracefile.Meta{Tool: "t", StartWall: time.Unix(1700000000, 0).UTC(), StartBoot: memvizBase}
}

// memvizItems: pid 7 on two devices, a free, an OOM, a non-OOM failure and
// pinned host memory (left out); pid 8 allocates once.
func memvizItems() []any {
	ev := func(tm uint64, pid uint32, api events.API, addr, size uint64, dev int32, stack ...uint64) events.Event {
		return events.Event{Time: memvizBase + tm, Duration: 10, PID: pid, TID: pid, Comm: "train", API: api,
			Addr: addr, Size: size, Device: dev, Stack: stack}
	}
	free := func(tm uint64, addr uint64, dev int32) events.Event {
		return events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: events.CudaFree, Addr: addr,
			Device: dev, Flags: events.FlagEntryOnly}
	}
	oom := ev(4000, 7, events.CudaMalloc, 0, 1<<40, 1, 0xa1)
	oom.Result = 2 // cudaErrorMemoryAllocation
	bad := ev(4500, 7, events.CudaMalloc, 0, 0, 0, 0xa1)
	bad.Result = 1 // cudaErrorInvalidValue: not an OOM
	return []any{
		&tracefile.Process{PID: 7, Comm: "train", Time: memvizBase,
			Maps: []tracefile.Mapping{{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: "/opt/train"}}},
		ev(1000, 7, events.CudaMalloc, 0x7000_0000, 2<<20, 0, 0xa1),
		ev(2000, 7, events.CudaMalloc, 0x7100_0000, 512, 1, 0xb1),
		ev(2500, 7, events.CudaMallocHost, 0x9000, 64, 0, 0xc1),
		free(3000, 0x7000_0000, 0),
		// The driver's view before the OOM: device 1 had 7 GiB free.
		&tracefile.NVML{Time: memvizBase + 3500, Devices: []tracefile.NVMLDevice{
			{Index: 0, Total: 16 << 30, Used: 1 << 30, Free: 15 << 30},
			{Index: 1, Total: 16 << 30, Used: 9 << 30, Free: 7 << 30}}},
		oom,
		bad,
		ev(5000, 7, events.CudaMallocManaged, 0x7200_0000, 4096, 0, 0xa1),
		ev(6000, 8, events.CudaMalloc, 0x7000_0000, 100, 0, 0xd1),
		&tracefile.End{Time: memvizBase + 7000},
	}
}

// memvizDumpScript prints the snapshot a pickle holds as JSON.
const memvizDumpScript = `
import json, pickle, sys
json.dump(pickle.load(open(sys.argv[1], "rb")), sys.stdout)
`

func memvizExport(t *testing.T, path string, opts Options) map[string]any {
	t.Helper()
	return memvizExportWant(t, path, opts, memviztest.Want{})
}

// memvizExportWant exports the trace at path as memviz, checks the file as
// memory_viz reads it (memviztest.Check) and returns it as JSON.
func memvizExportWant(t *testing.T, path string, opts Options, want memviztest.Want) map[string]any {
	t.Helper()
	py := testenv.Python3(t, "pickle", "pickletools")
	out := filepath.Join(t.TempDir(), "snap.pickle")
	var buf bytes.Buffer
	if err := WriteMemvizTrace(&buf, path, opts); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	memviztest.Check(t, out, want)
	var snap map[string]any
	if err := json.Unmarshal(testenv.RunPython(t, py, memvizDumpScript, out), &snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// The snapshot of a trace, every field. Without symbolization, frames
// carry only their address.
func TestMemvizTrace(t *testing.T) {
	path, _ := tracetest.Write(t, memvizMeta(), memvizItems()...)
	snap := memvizExportWant(t, path, Options{PIDs: []uint32{7}, NoSymbolize: true}, memviztest.Want{DeviceKnown: true})

	a1 := []any{map[string]any{"name": "0xa1", "filename": "", "line": 0.0}}
	b1 := []any{map[string]any{"name": "0xb1", "filename": "", "line": 0.0}}
	seg := func(dev, addr, size float64, kind string, frames []any) map[string]any {
		return map[string]any{"device": dev, "address": addr, "total_size": size, "allocated_size": size,
			"active_size": size, "requested_size": size, "stream": 0.0, "segment_type": kind,
			"segment_pool_id": []any{0.0, 0.0}, "is_expandable": false, "frames": frames,
			"blocks": []any{map[string]any{"address": addr, "size": size, "requested_size": size,
				"state": "active_allocated", "frames": frames}}}
	}
	// The live set at the end, by address: the 2 MiB block was freed, the
	// pinned host memory is not device memory.
	wantSegs := []any{
		seg(1, 0x7100_0000, 512, "small", b1),
		seg(0, 0x7200_0000, 4096, "small", a1),
	}
	if got := snap["segments"]; !reflect.DeepEqual(got, wantSegs) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(wantSegs)
		t.Errorf("segments\n got %s\nwant %s", g, w)
	}

	// time_us: the Unix µs when the call returned (the meta's wall clock
	// at 1700000000 s plus the µs since its start).
	const t0 = 1700000000_000000.0
	entry := func(action string, addr, size float64, frames []any, us float64) map[string]any {
		return map[string]any{"action": action, "addr": addr, "size": size, "stream": 0.0, "frames": frames,
			"time_us": t0 + us}
	}
	// device_free: NVML's free memory on device 1 at the sample before.
	oom := map[string]any{"action": "oom", "device_free": float64(7 << 30), "size": float64(1 << 40), "stream": 0.0,
		"frames": a1, "time_us": t0 + 4}
	want := []any{
		[]any{
			entry("segment_alloc", 0x7000_0000, 2<<20, a1, 1), entry("alloc", 0x7000_0000, 2<<20, a1, 1),
			entry("free_requested", 0x7000_0000, 2<<20, a1, 3), entry("free_completed", 0x7000_0000, 2<<20, a1, 3),
			entry("segment_free", 0x7000_0000, 2<<20, a1, 3),
			entry("segment_alloc", 0x7200_0000, 4096, a1, 5), entry("alloc", 0x7200_0000, 4096, a1, 5),
		},
		[]any{
			entry("segment_alloc", 0x7100_0000, 512, b1, 2), entry("alloc", 0x7100_0000, 512, b1, 2),
			oom,
		},
	}
	wantSettings := map[string]any{"trace_alloc_max_entries": float64(DefaultMemvizEntries), "trace_alloc_overflowed": false,
		"device_free_source": "nvml: the driver's free memory on the device at its last sample before the oom (--nvml-interval apart)"}
	if got := snap["allocator_settings"]; !reflect.DeepEqual(got, wantSettings) {
		t.Errorf("allocator_settings %v, want %v", got, wantSettings)
	}
	got := snap["device_traces"]
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Errorf("device_traces\n got %s\nwant %s", g, w)
	}

	// At a moment: only what had happened by then.
	snap = memvizExport(t, path, Options{PIDs: []uint32{7}, NoSymbolize: true, At: Moment{At: 2500 * time.Nanosecond}})
	// 2 MiB is a small-pool segment's size (kSmallBuffer): large-pool ones
	// are 10 MiB or more.
	wantSegs = []any{seg(0, 0x7000_0000, 2<<20, "small", a1), seg(1, 0x7100_0000, 512, "small", b1)}
	if got := snap["segments"]; !reflect.DeepEqual(got, wantSegs) {
		g, _ := json.Marshal(got)
		t.Errorf("segments at 2.5µs: %s", g)
	}
	if n0, n1 := len(snap["device_traces"].([]any)[0].([]any)), len(snap["device_traces"].([]any)[1].([]any)); n0 != 2 || n1 != 2 {
		t.Errorf("traces at 2.5µs have %d and %d entries, want 2 and 2", n0, n1)
	}
}

// Each device's trace keeps its latest entries.
func TestMemvizTraceCap(t *testing.T) {
	path, _ := tracetest.Write(t, memvizMeta(), memvizItems()...)
	snap := memvizExport(t, path, Options{PIDs: []uint32{7}, NoSymbolize: true, MemvizEntries: 2})
	var actions [][]string
	for _, tr := range snap["device_traces"].([]any) {
		var a []string
		for _, e := range tr.([]any) {
			a = append(a, e.(map[string]any)["action"].(string))
		}
		actions = append(actions, a)
	}
	want := [][]string{{"segment_alloc", "alloc"}, {"alloc", "oom"}}
	if !reflect.DeepEqual(actions, want) {
		t.Errorf("capped traces %v, want %v", actions, want)
	}
	if addr := snap["device_traces"].([]any)[0].([]any)[0].(map[string]any)["addr"]; addr != float64(0x7200_0000) {
		t.Errorf("device 0 keeps %v, want the latest allocation", addr)
	}
	if n := len(snap["segments"].([]any)); n != 2 {
		t.Errorf("%d segments: the cap must not touch them", n)
	}
	// The viewer says the history was cut.
	wantSettings := map[string]any{"trace_alloc_max_entries": 2.0, "trace_alloc_overflowed": true,
		"device_free_source": "nvml: the driver's free memory on the device at its last sample before the oom (--nvml-interval apart)"}
	if got := snap["allocator_settings"]; !reflect.DeepEqual(got, wantSettings) {
		t.Errorf("allocator_settings %v, want %v", got, wantSettings)
	}
}

// MemvizNoTrace (--memviz-entries 0) gives the segments alone: every
// device's trace empty, the settings saying why. It used to mean the
// default, 100000 entries.
func TestMemvizNoTrace(t *testing.T) {
	path, _ := tracetest.Write(t, memvizMeta(), memvizItems()...)
	snap := memvizExport(t, path, Options{PIDs: []uint32{7}, NoSymbolize: true, MemvizEntries: MemvizNoTrace})
	traces := snap["device_traces"].([]any)
	if len(traces) != 2 || len(traces[0].([]any)) != 0 || len(traces[1].([]any)) != 0 {
		t.Errorf("device_traces %v, want two empty lists", traces)
	}
	if n := len(snap["segments"].([]any)); n != 2 {
		t.Errorf("%d segments, want 2", n)
	}
	s := snap["allocator_settings"].(map[string]any)
	if s["trace_alloc_max_entries"] != 0.0 || s["trace_alloc_overflowed"] != true {
		t.Errorf("allocator_settings %v, want max_entries 0, overflowed", s)
	}
}

// A snapshot is one process's: two need --pid, and the error says which.
func TestMemvizTraceNeedsOneProcess(t *testing.T) {
	path, _ := tracetest.Write(t, memvizMeta(), memvizItems()...)
	err := WriteMemvizTrace(&bytes.Buffer{}, path, Options{})
	if err == nil || !strings.Contains(err.Error(), "choose one with --pid (7, 8)") {
		t.Errorf("two processes: %v", err)
	}
	snap := memvizExport(t, path, Options{PIDs: []uint32{8}, NoSymbolize: true})
	if segs := snap["segments"].([]any); len(segs) != 1 || segs[0].(map[string]any)["total_size"] != 100.0 {
		t.Errorf("pid 8's segments: %v", segs)
	}
}

// With tensor events, segments are cut into the live tensors' blocks (and
// inactive ones between), and the trace has segment and block entries of
// their own.
func TestMemvizTraceTensors(t *testing.T) {
	ev := func(tm uint64, api events.API, addr, size uint64) events.Event {
		return events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size,
			Flags: events.FlagEntryOnly}
	}
	path, _ := tracetest.Write(t, memvizMeta(),
		ev(1000, events.CudaMalloc, 0x1000, 4096),
		ev(2000, events.TorchMalloc, 0x1000, 100),
		ev(3000, events.TorchMalloc, 0x1400, 50),
		ev(4000, events.TorchMalloc, 0x1200, 10),
		ev(5000, events.TorchFree, 0x1200, 0),
		&tracefile.End{Time: memvizBase + 6000})
	snap := memvizExport(t, path, Options{NoSymbolize: true})
	seg := snap["segments"].([]any)[0].(map[string]any)
	type blk struct {
		addr, size, req float64
		state           string
	}
	var got []blk
	for _, b := range seg["blocks"].([]any) {
		m := b.(map[string]any)
		got = append(got, blk{m["address"].(float64), m["size"].(float64), m["requested_size"].(float64), m["state"].(string)})
	}
	want := []blk{
		{0x1000, 512, 100, "active_allocated"},
		{0x1200, 512, 0, "inactive"},
		{0x1400, 512, 50, "active_allocated"},
		{0x1600, 0xa00, 0, "inactive"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("blocks\n got %v\nwant %v", got, want)
	}
	if seg["allocated_size"] != 1024.0 || seg["requested_size"] != 150.0 || seg["total_size"] != 4096.0 {
		t.Errorf("segment sizes: allocated %v requested %v total %v", seg["allocated_size"], seg["requested_size"], seg["total_size"])
	}
	var actions []string
	for _, e := range snap["device_traces"].([]any)[0].([]any) {
		actions = append(actions, e.(map[string]any)["action"].(string))
	}
	if w := []string{"segment_alloc", "alloc", "alloc", "alloc", "free_requested", "free_completed"}; !reflect.DeepEqual(actions, w) {
		t.Errorf("trace %v, want %v", actions, w)
	}
}

// A trace that begins after the process's segments exist (record --pid, the
// agent's windows): tensors in a segment the trace never saw allocated.
// The live one gets a segment of its own, so nothing live is dropped; the
// one freed before the end leaves no entry, as no listed memory holds it;
// the viewer's backward walk finds every entry in a listed segment.
func TestMemvizTraceAttached(t *testing.T) {
	ev := func(tm uint64, api events.API, addr, size uint64) events.Event {
		return events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size,
			Stack: []uint64{0xa1}}
	}
	path, _ := tracetest.Write(t, memvizMeta(),
		&tracefile.Process{PID: 7, Comm: "train", Time: memvizBase},
		// Before the trace: a 2 MiB segment at 0x20_0000 held tensors.
		ev(1000, events.TorchMalloc, 0x20_0000, 600_000),   // live at the end
		ev(1500, events.TorchMalloc, 0x30_0000, 1000),      // freed below
		ev(2000, events.CudaMalloc, 0x100_0000, 4096),      // seen
		ev(2500, events.TorchMalloc, 0x100_0000, 512),      // in the seen segment
		ev(3000, events.TorchFree, 0x30_0000, 0),           // the orphan freed
		ev(3500, events.TorchMalloc, 0x40_0000, 1_900_000), // live, another unseen segment
		&tracefile.End{Time: memvizBase + 6000})
	snap := memvizExport(t, path, Options{NoSymbolize: true})
	type segT struct{ addr, size, allocated float64 }
	var segs []segT
	for _, s := range snap["segments"].([]any) {
		m := s.(map[string]any)
		segs = append(segs, segT{m["address"].(float64), m["total_size"].(float64), m["allocated_size"].(float64)})
	}
	want := []segT{{0x20_0000, 600_000, 600_000}, {0x40_0000, 1_900_000, 1_900_000}, {0x100_0000, 4096, 512}}
	if !reflect.DeepEqual(segs, want) {
		t.Errorf("segments %v, want %v", segs, want)
	}
	type entT struct {
		action string
		addr   float64
	}
	var got []entT
	for _, e := range snap["device_traces"].([]any)[0].([]any) {
		m := e.(map[string]any)
		got = append(got, entT{m["action"].(string), m["addr"].(float64)})
	}
	wantE := []entT{{"alloc", 0x20_0000}, {"segment_alloc", 0x100_0000}, {"alloc", 0x100_0000}, {"alloc", 0x40_0000}}
	if !reflect.DeepEqual(got, wantE) {
		t.Errorf("trace %v, want %v", got, wantE)
	}
}

// Without NVML nothing in the trace says how large the device is: the oom
// entry leaves device_free out rather than claim 0 bytes free, and the
// Allocator Settings tab says why.
func TestMemvizOOMWithoutNVML(t *testing.T) {
	var items []any
	for _, it := range memvizItems() {
		if _, nvml := it.(*tracefile.NVML); !nvml {
			items = append(items, it)
		}
	}
	path, _ := tracetest.Write(t, memvizMeta(), items...)
	snap := memvizExport(t, path, Options{PIDs: []uint32{7}, NoSymbolize: true})
	dev1 := snap["device_traces"].([]any)[1].([]any)
	oom := dev1[len(dev1)-1].(map[string]any)
	if _, has := oom["device_free"]; has || oom["action"] != "oom" {
		t.Errorf("oom entry %v: want no device_free where the device's size is unknown", oom)
	}
	want := "unknown for 1 of 1 ooms: device_free left out, the trace has no NVML sample of the device before them (the device's size is known only to NVML: record where the driver is loaded, with --nvml)"
	if got := snap["allocator_settings"].(map[string]any)["device_free_source"]; got != want {
		t.Errorf("device_free_source %q, want %q", got, want)
	}
}
