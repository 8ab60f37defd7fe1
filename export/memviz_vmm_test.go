package export

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

// memvizBlk is a block as a test compares it.
type memvizBlk struct {
	Addr, Size, Req float64
	State           string
}

func memvizBlocks(seg map[string]any) []memvizBlk {
	var out []memvizBlk
	for _, b := range seg["blocks"].([]any) {
		m := b.(map[string]any)
		out = append(out, memvizBlk{m["address"].(float64), m["size"].(float64), m["requested_size"].(float64), m["state"].(string)})
	}
	return out
}

// memvizActionList lists a device's trace as "action addr size".
func memvizActionList(snap map[string]any, dev int) []string {
	var out []string
	for _, e := range snap["device_traces"].([]any)[dev].([]any) {
		m := e.(map[string]any)
		out = append(out, m["action"].(string)+" "+hex(uint64(m["addr"].(float64)))+" "+
			hex(uint64(m["size"].(float64))))
	}
	return out
}

const (
	vmmVA1, vmmVA2 = 0x1948_0000_00, 0x1948_0000_00 + 20<<20 // adjacent: one expandable segment
	vmmVA3         = 0x1960_0000_00                          // mapped, then unmapped
	mib            = 1 << 20
)

// vmmItems is PyTorch's expandable segments as the real driver shows them:
// cuMemCreate returns an opaque handle (a heap address in the process,
// 0xebb5cf0, 0x7ff4…), not a device address; cuMemMap places the memory.
// Two 20 MiB pages mapped one after the other, a third mapped and
// unmapped, a 2 MiB one created and never mapped, and a cudaMalloc
// segment beside them.
func vmmItems(tensors bool) []any {
	ev := func(tm uint64, api events.API, addr, size uint64, stack ...uint64) events.Event {
		return events.Event{Time: memvizBase + tm, Duration: 10, PID: 7, TID: 7, Comm: "train", API: api,
			Addr: addr, Size: size, Stack: stack}
	}
	mapAt := func(tm uint64, va, size, handle uint64) events.Event {
		e := ev(tm, events.CuMemMap, va, size, 0xe9)
		e.Aux, e.Flags = handle, events.FlagAux
		return e
	}
	items := []any{
		&tracefile.Process{PID: 7, Comm: "train", Time: memvizBase},
		ev(1000, events.CudaMalloc, 0x7000_0000, 4096, 0xa1),
		ev(1500, events.CuMemAddressReserve, 0x1948_0000_00, 80<<30),
		ev(2000, events.CuMemCreate, 0xebb5cf0, 20*mib, 0xe1),
		ev(2100, events.CuMemCreate, 0x7ff4_0000_1230, 20*mib, 0xe1),
		ev(2200, events.CuMemCreate, 0xebb6000, 2*mib, 0xe2), // never mapped
		mapAt(3000, vmmVA1, 20*mib, 0xebb5cf0),
		mapAt(3100, vmmVA2, 20*mib, 0x7ff4_0000_1230),
		ev(3200, events.CuMemCreate, 0xebb7000, 20*mib, 0xe3),
		mapAt(3300, vmmVA3, 20*mib, 0xebb7000),
		ev(3400, events.CuMemUnmap, vmmVA3, 20*mib),
		ev(3500, events.CuMemRelease, 0xebb7000, 0),
	}
	if tensors {
		items = append(items,
			ev(4000, events.TorchMalloc, vmmVA1, 30*mib, 0xc1),      // over both pages
			ev(4100, events.TorchMalloc, vmmVA1+30*mib, 1000, 0xc2), // rounded only: expandable
		)
	}
	return append(items, &tracefile.End{Time: memvizBase + 6000})
}

// VMM memory is drawn where it is mapped, as PyTorch draws an expandable
// segment: one segment per run of adjacent mappings at their virtual
// addresses, the trace's entries segment_map and segment_unmap there.
// The handles, which are no addresses, appear nowhere; physical memory
// mapped nowhere is left out, and said so. Before, the export put segments
// at the handles and failed on their overlap.
func TestMemvizTraceVMM(t *testing.T) {
	var warned []string
	opts := Options{NoSymbolize: true, Warn: func(s string) { warned = append(warned, s) }}
	path, _ := tracetest.Write(t, memvizMeta(), vmmItems(true)...)
	snap := memvizExport(t, path, opts)
	segs := snap["segments"].([]any)
	if len(segs) != 2 {
		t.Fatalf("%d segments, want the cudaMalloc one and one expandable: %v", len(segs), segs)
	}
	small, exp := segs[0].(map[string]any), segs[1].(map[string]any)
	if small["address"] != float64(0x7000_0000) || small["is_expandable"] != false {
		t.Errorf("the cudaMalloc segment: %v", small)
	}
	if exp["address"] != float64(vmmVA1) || exp["total_size"] != float64(40*mib) || exp["is_expandable"] != true ||
		exp["segment_type"] != "large" || exp["allocated_size"] != float64(30*mib+1024) {
		t.Errorf("the expandable segment: address %#x total %v expandable %v type %v allocated %v",
			uint64(exp["address"].(float64)), exp["total_size"], exp["is_expandable"], exp["segment_type"], exp["allocated_size"])
	}
	// Its frames are the cuMemCreate's.
	if f := exp["frames"].([]any); len(f) != 1 || f[0].(map[string]any)["name"] != "0xe1" {
		t.Errorf("expandable segment's frames %v", f)
	}
	wantBlocks := []memvizBlk{
		{vmmVA1, 30 * mib, 30 * mib, "active_allocated"},
		{vmmVA1 + 30*mib, 1024, 1000, "active_allocated"},
		{vmmVA1 + 30*mib + 1024, 10*mib - 1024, 0, "inactive"},
	}
	if got := memvizBlocks(exp); !reflect.DeepEqual(got, wantBlocks) {
		t.Errorf("expandable blocks\n got %v\nwant %v", got, wantBlocks)
	}
	want := []string{
		"segment_alloc 0x70000000 0x1000",
		"segment_map 0x1948000000 0x1400000", "segment_map 0x1949400000 0x1400000",
		"segment_map 0x1960000000 0x1400000", "segment_unmap 0x1960000000 0x1400000",
		"alloc 0x1948000000 0x1e00000", "alloc 0x1949e00000 0x3e8",
	}
	if got := memvizActionList(snap, 0); !reflect.DeepEqual(got, want) {
		t.Errorf("trace\n got %q\nwant %q", got, want)
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "1 VMM allocations (2.0 MiB, cuMemCreate) not mapped at the moment left out") {
		t.Errorf("warnings %q, want one about the 2 MiB mapped nowhere", warned)
	}

	// Without tensor events each mapping is a block of its run.
	path, _ = tracetest.Write(t, memvizMeta(), vmmItems(false)...)
	snap = memvizExport(t, path, Options{NoSymbolize: true})
	exp = snap["segments"].([]any)[1].(map[string]any)
	wantBlocks = []memvizBlk{{vmmVA1, 20 * mib, 20 * mib, "active_allocated"}, {vmmVA2, 20 * mib, 20 * mib, "active_allocated"}}
	if got := memvizBlocks(exp); !reflect.DeepEqual(got, wantBlocks) || exp["is_expandable"] != true {
		t.Errorf("expandable blocks without tensors\n got %v\nwant %v", got, wantBlocks)
	}
	want = []string{
		"segment_alloc 0x70000000 0x1000", "alloc 0x70000000 0x1000",
		"segment_map 0x1948000000 0x1400000", "alloc 0x1948000000 0x1400000",
		"segment_map 0x1949400000 0x1400000", "alloc 0x1949400000 0x1400000",
		"segment_map 0x1960000000 0x1400000", "alloc 0x1960000000 0x1400000",
		"free_requested 0x1960000000 0x1400000", "free_completed 0x1960000000 0x1400000", "segment_unmap 0x1960000000 0x1400000",
	}
	if got := memvizActionList(snap, 0); !reflect.DeepEqual(got, want) {
		t.Errorf("trace without tensors\n got %q\nwant %q", got, want)
	}

	// Before the first map, the physical memory is nowhere.
	warned = nil
	opts.At = Moment{At: 2500 * time.Nanosecond}
	path, _ = tracetest.Write(t, memvizMeta(), vmmItems(true)...)
	snap = memvizExport(t, path, opts)
	if segs := snap["segments"].([]any); len(segs) != 1 {
		t.Errorf("before the maps: %d segments, want the cudaMalloc one", len(segs))
	}
	if len(warned) != 1 || !strings.Contains(warned[0], "3 VMM allocations (42.0 MiB, cuMemCreate) not mapped at the moment left out") {
		t.Errorf("warnings before the maps %q", warned)
	}
}

// PyTorch's caching allocator does not split a large-pool block when 1 MiB
// (kSmallSize) or less would remain past the rounded request
// (should_split): the tensor gets the whole block, and memory_allocated
// counts it. So in a large segment, what is left up to the next tensor or
// the segment's end, when that small, is the tensor's block, not a free
// one. Small-pool segments (2 MiB) split at any remainder of 512 bytes:
// their gaps stay free. The trace entries keep the requested size, as
// PyTorch's alloc entries do (orig_size).
func TestMemvizTraceUnsplit(t *testing.T) {
	ev := func(tm uint64, api events.API, addr, size uint64) events.Event {
		return events.Event{Time: memvizBase + tm, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size,
			Flags: events.FlagEntryOnly}
	}
	const a, b, c = 0x7000_0000, 0x7200_0000, 0x7400_0000
	path, _ := tracetest.Write(t, memvizMeta(),
		ev(1000, events.CudaMalloc, a, 20*mib),
		ev(1100, events.TorchMalloc, a, 16*mib),
		// As torch-native on an H100: 1.5 MiB free, then 1.5 MiB asked
		// for with 1 MiB left after it: PyTorch's block is 2.5 MiB.
		ev(1200, events.TorchMalloc, a+16*mib+1536*1024, 1536*1024),
		ev(2000, events.CudaMalloc, b, 20*mib),
		ev(2100, events.TorchMalloc, b, 3*mib+100),   // 1 MiB - 512 left before the next: its block
		ev(2200, events.TorchMalloc, b+4*mib, 2*mib), // 14 MiB left after: free
		ev(3000, events.CudaMalloc, c, 2*mib),
		ev(3100, events.TorchMalloc, c, 100),
		ev(3200, events.TorchMalloc, c+0x40400, 512), // 256.5 KiB free before it: small pool
		&tracefile.End{Time: memvizBase + 6000})
	snap := memvizExport(t, path, Options{NoSymbolize: true})
	segs := snap["segments"].([]any)
	want := [][]memvizBlk{
		{{a, 16 * mib, 16 * mib, "active_allocated"}, {a + 16*mib, 1536 * 1024, 0, "inactive"},
			{a + 16*mib + 1536*1024, 2560 * 1024, 1536 * 1024, "active_allocated"}},
		{{b, 4 * mib, 3*mib + 100, "active_allocated"}, {b + 4*mib, 2 * mib, 2 * mib, "active_allocated"},
			{b + 6*mib, 14 * mib, 0, "inactive"}},
		{{c, 512, 100, "active_allocated"}, {c + 512, 0x40400 - 512, 0, "inactive"},
			{c + 0x40400, 512, 512, "active_allocated"}, {c + 0x40600, 2*mib - 0x40600, 0, "inactive"}},
	}
	if len(segs) != len(want) {
		t.Fatalf("%d segments, want %d", len(segs), len(want))
	}
	types := []string{"large", "large", "small"}
	for i := range want {
		seg := segs[i].(map[string]any)
		if got := memvizBlocks(seg); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("segment %d blocks\n got %v\nwant %v", i, got, want[i])
		}
		if seg["segment_type"] != types[i] {
			t.Errorf("segment %d is %v, want %s", i, seg["segment_type"], types[i])
		}
	}
	var allocs []string
	for _, e := range memvizActionList(snap, 0) {
		if strings.HasPrefix(e, "alloc ") {
			allocs = append(allocs, e)
		}
	}
	wantAllocs := []string{"alloc 0x70000000 0x1000000", "alloc 0x71180000 0x180000", "alloc 0x72000000 0x300064",
		"alloc 0x72400000 0x200000", "alloc 0x74000000 0x64", "alloc 0x74040400 0x200"}
	if !reflect.DeepEqual(allocs, wantAllocs) {
		t.Errorf("alloc entries\n got %q\nwant %q", allocs, wantAllocs)
	}
}

// The rule on real figures: the segments and live tensors cudatrace saw
// at the moment of PyTorch's own snapshot in torch-native (H100, PyTorch
// 2.11) cut into blocks give PyTorch's active blocks, address for address
// and size for size. Before, the block at 0x7fc7c9180000 was 1.5 MiB,
// PyTorch's 2.5 MiB.
func TestMemvizTorchNativeBlocks(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "torch-native-blocks.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Segments    [][2]uint64 `json:"segments"`     // address, total_size
		Tensors     [][2]uint64 `json:"tensors"`      // address, requested size
		TorchBlocks [][2]uint64 `json:"torch_blocks"` // address, size
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var segs, tensors []*ledger.Allocation
	for _, s := range doc.Segments {
		segs = append(segs, &ledger.Allocation{Addr: s[0], Size: s[1], API: events.CudaMalloc})
	}
	for _, s := range doc.Tensors {
		tensors = append(tensors, &ledger.Allocation{Addr: s[0], Size: s[1], API: events.TorchMalloc})
	}
	l := memvizSegments(segs, nil, tensors, true, func(*ledger.Stack) []MemvizFrame { return nil })
	var got [][2]uint64
	var total uint64
	for _, seg := range l.segs {
		for _, b := range seg.Blocks {
			if b.State == MemvizActiveAllocated {
				got = append(got, [2]uint64{b.Address, b.Size})
				total += b.Size
			}
		}
	}
	if !reflect.DeepEqual(got, doc.TorchBlocks) {
		t.Errorf("active blocks\n got %v\nwant %v (PyTorch's)", got, doc.TorchBlocks)
	}
	if len(got) != 31 || total != 189199360 {
		t.Errorf("%d active blocks of %d bytes, want PyTorch's 31 of 189199360", len(got), total)
	}
}

// The agent's snapshot of a process using VMM memory: the history's maps
// and unmaps are segment_map and segment_unmap entries, the snapshot's
// segments the mapped runs, and memory_viz's walk finds every entry in a
// listed segment.
func TestLiveSnapshotVMM(t *testing.T) {
	l := ledger.New()
	var history []HistoryItem
	n := uint64(0)
	ev := func(api events.API, addr, size, aux uint64, keep bool) {
		n++
		e := events.Event{Time: n * 1000, PID: 1, Comm: "job", API: api, Addr: addr, Size: size, Aux: aux,
			Stack: []uint64{uint64(api)}}
		if aux != 0 {
			e.Flags = events.FlagAux
		}
		ch := l.Apply(&e)
		if keep {
			it := HistoryItem{End: e.End(), API: e.API, Result: e.Result, Size: e.Size, Device: e.Device, Change: ch}
			it.Change.Process = nil
			history = append(history, it)
		}
	}
	// Before the history: a page mapped, with a tensor in it.
	ev(events.CuMemCreate, 0xebb5cf0, 20*mib, 0, false)
	ev(events.CuMemMap, vmmVA1, 20*mib, 0xebb5cf0, false)
	ev(events.TorchMalloc, vmmVA1, 4096, 0, false)
	// The history: the segment grows by a page, a tensor spans both; a
	// third page comes and goes.
	ev(events.CuMemCreate, 0x7ff4_0000_1230, 20*mib, 0, true)
	ev(events.CuMemMap, vmmVA2, 20*mib, 0x7ff4_0000_1230, true)
	ev(events.TorchMalloc, vmmVA1+10*mib, 20*mib, 0, true)
	ev(events.CuMemCreate, 0xebb7000, 20*mib, 0, true)
	ev(events.CuMemMap, vmmVA3, 20*mib, 0xebb7000, true)
	ev(events.TorchMalloc, vmmVA3, 1000, 0, true)
	ev(events.TorchFree, vmmVA3, 0, 0, true)
	ev(events.CuMemUnmap, vmmVA3, 20*mib, 0, true)
	ev(events.CuMemRelease, 0xebb7000, 0, 0, true)

	p := l.Process(1)
	wall := func(boot uint64) time.Time { return time.Unix(1700000000, int64(boot)) }
	entries := HistoryEntries(history, p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true, wall)
	var got []string
	for _, e := range entries {
		got = append(got, string(e.Action)+" "+hex(e.Addr))
	}
	want := []string{"segment_map 0x1949400000", "alloc 0x1948a00000", "segment_map 0x1960000000",
		"alloc 0x1960000000", "free_requested 0x1960000000", "free_completed 0x1960000000", "segment_unmap 0x1960000000"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries\n got %q\nwant %q", got, want)
	}
	snap, err := LiveSnapshot(p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true, entries, fakeStacks{})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Segments) != 1 || snap.Segments[0].Address != vmmVA1 || snap.Segments[0].TotalSize != 40*mib ||
		!snap.Segments[0].IsExpandable || snap.Segments[0].AllocatedSize != 4096+20*mib {
		t.Fatalf("segments %+v", snap.Segments)
	}
	checkViewer(t, snap)
}
