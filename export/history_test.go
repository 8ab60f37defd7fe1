package export

import (
	"strconv"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
)

// TestHistoryEntries: a history that begins in the middle of a process's
// life, with PyTorch's tensor events: segments made before it and freed in
// it, tensors in them, a tensor in a segment never seen (an orphan), and a
// segment made and freed inside it. The entries undo from the snapshot
// (memviztest walks them as memory_viz does), and none is made for a
// tensor in memory the snapshot never lists.
func TestHistoryEntries(t *testing.T) {
	h := newHistoryLog()
	ev := h.ev
	// Before the history: a segment with a tensor in it.
	ev(events.CudaMalloc, 0x100000, 1<<20, false)
	ev(events.TorchMalloc, 0x100000, 4096, false)
	// The history.
	ev(events.TorchFree, 0x100000, 0, true)
	ev(events.CudaFree, 0x100000, 0, true)       // made before, freed in it
	ev(events.TorchMalloc, 0x900000, 2048, true) // in no segment ever seen: an orphan, live
	ev(events.TorchMalloc, 0xa00000, 512, true)  // in no segment, freed: no entry
	ev(events.TorchFree, 0xa00000, 0, true)      //
	ev(events.CudaMalloc, 0x200000, 2<<20, true) // made and freed in it
	ev(events.TorchMalloc, 0x200000, 8192, true) //
	ev(events.TorchFree, 0x200000, 0, true)      //
	ev(events.CudaFree, 0x200000, 0, true)       //
	ev(events.CudaMalloc, 0x300000, 1<<20, true) // made in it, live
	ev(events.TorchMalloc, 0x300000, 1000, true) //

	p, history := h.l.Process(1), h.items
	wall := func(boot uint64) time.Time { return time.Unix(1700000000, int64(boot)) }
	entries := HistoryEntries(history, p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true, wall)
	var got []string
	for _, e := range entries {
		got = append(got, string(e.Action)+" "+hex(e.Addr))
		if e.TimeUS == 0 || e.Stack == nil {
			t.Errorf("entry %+v: no time or stack", e)
		}
	}
	want := []string{
		"free_requested 0x100000", "free_completed 0x100000", "segment_free 0x100000",
		"alloc 0x900000",
		"segment_alloc 0x200000", "alloc 0x200000", "free_requested 0x200000", "free_completed 0x200000", "segment_free 0x200000",
		"segment_alloc 0x300000", "alloc 0x300000",
	}
	if len(got) != len(want) {
		t.Fatalf("entries %q\nwant %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entries %q\nwant %q", got, want)
		}
	}
	snap, err := LiveSnapshot(p.LiveAllocations(), p.Mappings(), p.LiveTensors(), true, entries, fakeStacks{})
	if err != nil {
		t.Fatal(err)
	}
	checkViewer(t, snap)
}

func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }
