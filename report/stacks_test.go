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

// TestStacksBothLevels: forward's tensor probe (train.c:20) and its
// cudaMalloc call (train.c:21) are two stacks in the ledger, one per level,
// through the same functions: the report lists them once, tensor bytes used
// beside segment bytes acquired; backward's tensor has a path of its own.
func TestStacksBothLevels(t *testing.T) {
	const base = 1_000_000_000
	fn := map[uint64][2]any{0x1200: {"forward", 20}, 0x1210: {"forward", 21}, 0x1300: {"main", 30}, 0x1400: {"backward", 40}}
	var syms []tracefile.Symbol
	for addr, f := range fn {
		for _, off := range []uint64{addr - 0x1000, addr - 0x1000 - 1} {
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
		ev(1000, events.CudaMalloc, 0x10000, 1<<20, 0x1210, 0x1300),
		ev(1500, events.TorchMalloc, 0x10000, 1000, 0x1200, 0x1300),
		ev(2500, events.TorchMalloc, 0x10400, 3000, 0x1200, 0x1300),
		free,
		ev(4500, events.TorchMalloc, 0x10c00, 500, 0x1400, 0x1300),
		&tracefile.End{Time: base + 6000})
	rep, err := Load(path, Options{Allocations: true})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		funcs                                                                          string
		allocs, allocBytes, live, liveCount, tAllocs, tBytes, tLive, tLiveCount, calls uint64
	}
	var got []row
	for _, s := range rep.Stacks {
		var names []string
		for _, f := range s.Frames {
			names = append(names, f.Function)
		}
		got = append(got, row{strings.Join(names, "<"), s.Allocs, s.AllocBytes, s.LiveBytes, s.LiveCount,
			s.TensorAllocs, s.TensorAllocBytes, s.TensorLiveBytes, s.TensorLiveCount, s.Calls})
	}
	want := []row{
		{"forward<main", 1, 1 << 20, 1 << 20, 1, 2, 4000, 3000, 1, 3},
		{"backward<main", 0, 0, 0, 0, 1, 500, 500, 1, 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("stacks\n got %+v\nwant %+v", got, want)
	}
	// The live set points at the merged entries.
	for _, a := range rep.Allocations {
		if a.Stack != 0 {
			t.Errorf("allocation %+v: stack %d, want 0 (forward<main)", a, a.Stack)
		}
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"Top stacks by live bytes (2 of 2):",
		"[1] tensors: 2.9 KiB live in 1; 3.9 KiB used in 2 calls | segments: 1.0 MiB live in 1; 1.0 MiB acquired in 1 call; pid 7 (train)",
		"[2] tensors: 500 B live in 1; 500 B used in 1 call; pid 7 (train)",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, buf.String())
		}
	}
}
