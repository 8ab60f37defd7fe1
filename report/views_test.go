package report

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

// viewTrace: one process with both levels. main calls forward, which
// allocates a 1 MiB segment through alloc_pool, two tensors (1000 and 3000
// bytes, the first freed) and 64 bytes of pinned host memory (not GPU
// memory: in no row); main calls backward, which allocates a 500-byte
// tensor. Frames are named by the trace's own symbols (train.c).
func viewTrace(t *testing.T) string {
	const base = 1_000_000_000
	fn := map[uint64][2]any{0x1100: {"alloc_pool", 10}, 0x1200: {"forward", 20}, 0x1300: {"main", 30}, 0x1400: {"backward", 40}}
	var syms []tracefile.Symbol
	for addr, f := range fn {
		for _, off := range []uint64{addr - 0x1000, addr - 0x1000 - 1} { // the return address, and the call site
			syms = append(syms, tracefile.Symbol{BuildID: "ab12", Offset: off, Function: f[0].(string), File: "train.c", Line: f[1].(int)})
		}
	}
	ev := func(tm uint64, api events.API, addr, size uint64, stack ...uint64) events.Event {
		return events.Event{Time: base + tm, Duration: 10, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr, Size: size, Stack: stack}
	}
	free := ev(3500, events.TorchFree, 0x10000, 0, 0x1200, 0x1300)
	free.Flags = events.FlagEntryOnly
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", StartWall: time.Unix(1700000000, 0), StartBoot: base},
		(&procmodel.Capture{PID: 7, Comm: "train", Time: base, Maps: []proc.Mapping{
			{Start: 0x1000, End: 0x9000, Perms: "r-xp", Path: "/opt/train", BuildID: "ab12"}}}).File(),
		&tracefile.Symbols{Frames: syms},
		ev(1000, events.CudaMalloc, 0x10000, 1<<20, 0x1100, 0x1200, 0x1300),
		ev(1500, events.TorchMalloc, 0x10000, 1000, 0x1200, 0x1300),
		ev(2500, events.TorchMalloc, 0x10400, 3000, 0x1200, 0x1300),
		free,
		ev(4500, events.TorchMalloc, 0x10c00, 500, 0x1400, 0x1300),
		ev(4600, events.CudaMallocHost, 0x90000, 64, 0x1200, 0x1300),
		&tracefile.End{Time: base + 6000})
	return path
}

// --by function: used (tensors), acquired (segments), occurrences and what
// is live of each, per function, every stack through it counted; with
// --interval the bytes added and removed per interval.
func TestViewByFunction(t *testing.T) {
	rep, err := Load(viewTrace(t), Options{By: ByFunction, Interval: 2 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	want := []ViewRow{
		{PID: 7, Key: "main", UsedBytes: 4500, UsedCount: 3, AcquiredBytes: mib, AcquiredCount: 1, Occurrences: 4,
			UsedLiveBytes: 3500, AcquiredLiveBytes: mib, Intervals: []ViewInterval{
				{Index: 0, AddedBytes: mib + 1000}, {Index: 1, AddedBytes: 3000, RemovedBytes: 1000}, {Index: 2, AddedBytes: 500}}},
		{PID: 7, Key: "forward", UsedBytes: 4000, UsedCount: 2, AcquiredBytes: mib, AcquiredCount: 1, Occurrences: 3,
			UsedLiveBytes: 3000, AcquiredLiveBytes: mib, Intervals: []ViewInterval{
				{Index: 0, AddedBytes: mib + 1000}, {Index: 1, AddedBytes: 3000, RemovedBytes: 1000}}},
		{PID: 7, Key: "backward", UsedBytes: 500, UsedCount: 1, Occurrences: 1, UsedLiveBytes: 500,
			Intervals: []ViewInterval{{Index: 2, AddedBytes: 500}}},
		{PID: 7, Key: "alloc_pool", AcquiredBytes: mib, AcquiredCount: 1, Occurrences: 1, AcquiredLiveBytes: mib,
			Intervals: []ViewInterval{{Index: 0, AddedBytes: mib}}},
	}
	if !reflect.DeepEqual(rep.View, want) {
		t.Errorf("view by function\n got %+v\nwant %+v", rep.View, want)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"By function (USED: tensors from the framework's pool; ACQUIRED: segments from the device; a stack counts in every function it passes through):",
		"  7  train  4.4 KiB   1.0 MiB            4    3.4 KiB        1.0 MiB  main",
		"  7   2µs  +2.9 KiB  -1000 B  main",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, buf.String())
		}
	}
}

// --by line: the same rows keyed by file:line.
func TestViewByLine(t *testing.T) {
	rep, err := Load(viewTrace(t), Options{By: ByLine})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range rep.View {
		keys = append(keys, r.Key)
	}
	if want := []string{"train.c:30", "train.c:20", "train.c:40", "train.c:10"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("rows %v, want %v", keys, want)
	}
	if r := rep.View[1]; r.UsedBytes != 4000 || r.AcquiredBytes != 1<<20 || r.Occurrences != 3 || r.Intervals != nil {
		t.Errorf("train.c:20 %+v", r)
	}
}
