package export

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

// ghostTrace is an agent's window: memory live when it began (FlagBefore
// records, the agent's live set, each with its stack) and the window's own
// calls. Segments: A (100 MiB, made before, live at the end), B (20 MiB,
// made before, freed in the window), D (10 MiB, made in the window, live),
// E (made and freed in the window); with tensors, segment C (2 MiB, made
// before) holds T1 (1 MiB, made before) and T2 (512 KiB, made in the
// window).
func ghostTrace(t *testing.T, tensors bool) string {
	ev := func(tm uint64, api events.API, addr, size uint64, before bool) events.Event {
		e := events.Event{Time: memvizBase + tm, Duration: 10, PID: 7, TID: 7, Comm: "train", API: api, Addr: addr,
			Size: size, Stack: []uint64{0xa0 + uint64(api)}}
		if api.Info().Op == events.OpFree {
			e.Duration, e.Flags, e.Stack = 0, events.FlagEntryOnly, nil
		}
		if before {
			e.Flags |= events.FlagBefore
		}
		return e
	}
	items := []any{&tracefile.Process{PID: 7, Comm: "train", Time: memvizBase},
		ev(0, events.CudaMalloc, 0x10_0000_0000, 100<<20, true),
		ev(0, events.CudaMalloc, 0x11_0000_0000, 20<<20, true)}
	if tensors {
		items = append(items, ev(0, events.CudaMalloc, 0x12_0000_0000, 2<<20, true),
			ev(0, events.TorchMalloc, 0x12_0000_0000, 1<<20, true))
	}
	items = append(items,
		ev(1000, events.CudaFree, 0x11_0000_0000, 0, false),
		ev(2000, events.CudaMalloc, 0x13_0000_0000, 10<<20, false),
		ev(3000, events.CudaMalloc, 0x14_0000_0000, 4<<20, false),
		ev(4000, events.CudaFree, 0x14_0000_0000, 0, false))
	if tensors {
		items = append(items, ev(5000, events.TorchMalloc, 0x12_0010_0000, 512<<10, false))
	}
	items = append(items, &tracefile.End{Time: memvizBase + 9000})
	path, _ := tracetest.Write(t, memvizMeta(), items...)
	return path
}

func memvizSummary(t *testing.T, write func(*bytes.Buffer) error) memviztest.Summary {
	t.Helper()
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "snap.pickle")
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return memviztest.Check(t, out, memviztest.Want{})
}

// Memory live before the trace began is what memory_viz (2026) draws as
// ghost blocks and initially allocated segments, and nothing else is: an
// agent's window exports its live set at the start with no alloc entry,
// and a block made before and freed in the window as one freed with no
// alloc before it.
func TestMemvizGhosts(t *testing.T) {
	t.Run("segments", func(t *testing.T) {
		path := ghostTrace(t, false)
		s := memvizSummary(t, func(b *bytes.Buffer) error { return WriteMemvizTrace(b, path, Options{NoSymbolize: true}) })
		if got, want := fmt.Sprint(s.Ghosts), fmt.Sprint(map[string][][2]uint64{"0": {{0x10_0000_0000, 100 << 20}}}); got != want {
			t.Errorf("ghost blocks %s, want %s (A alone)", got, want)
		}
		if got, want := fmt.Sprint(s.FreedBefore), fmt.Sprint(map[string][]uint64{"0": {0x11_0000_0000}}); got != want {
			t.Errorf("blocks freed with no alloc %s, want %s (B)", got, want)
		}
		if got, want := fmt.Sprint(s.SegmentsBefore), fmt.Sprint(map[string][]uint64{"0": {0x10_0000_0000}}); got != want {
			t.Errorf("segments there at the start %s, want %s (A)", got, want)
		}
	})
	t.Run("tensors", func(t *testing.T) {
		path := ghostTrace(t, true)
		s := memvizSummary(t, func(b *bytes.Buffer) error { return WriteMemvizTrace(b, path, Options{NoSymbolize: true}) })
		if got, want := fmt.Sprint(s.Ghosts), fmt.Sprint(map[string][][2]uint64{"0": {{0x12_0000_0000, 1 << 20}}}); got != want {
			t.Errorf("ghost blocks %s, want %s (T1 alone)", got, want)
		}
		before := s.SegmentsBefore["0"]
		slices.Sort(before)
		if want := []uint64{0x10_0000_0000, 0x12_0000_0000}; !slices.Equal(before, want) {
			t.Errorf("segments there at the start %#x, want %#x (A and C)", before, want)
		}
	})
}

// The agent's /snapshot: what a process held before its flight recorder's
// history began is a ghost block; what the history made is not.
func TestMemvizGhostsLive(t *testing.T) {
	h := newHistoryLog()
	h.ev(events.CudaMalloc, 0x100000, 1<<20, false) // before the history, live
	h.ev(events.CudaMalloc, 0x400000, 1<<20, false) // before the history, freed in it
	h.ev(events.CudaFree, 0x400000, 0, true)
	h.ev(events.CudaMalloc, 0x300000, 1<<20, true) // made in it, live
	l, history := h.l, h.items
	p := l.Process(1)
	wall := func(boot uint64) time.Time { return time.Unix(1700000000, int64(boot)) }
	entries := HistoryEntries(history, p.LiveAllocations(), p.Mappings(), p.LiveTensors(), false, wall)
	snap, err := LiveSnapshot(p.LiveAllocations(), p.Mappings(), p.LiveTensors(), false, entries, fakeStacks{})
	if err != nil {
		t.Fatal(err)
	}
	s := memvizSummary(t, func(b *bytes.Buffer) error { return WriteMemviz(b, snap) })
	if got, want := fmt.Sprint(s.Ghosts), fmt.Sprint(map[string][][2]uint64{"0": {{0x100000, 1 << 20}}}); got != want {
		t.Errorf("ghost blocks %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(s.FreedBefore), fmt.Sprint(map[string][]uint64{"0": {0x400000}}); got != want {
		t.Errorf("blocks freed with no alloc %s, want %s", got, want)
	}
}

// historyLog applies events of pid 1 to a ledger, keeping those asked for
// as a flight recorder's history (HistoryItem) keeps them.
type historyLog struct {
	l     *ledger.Ledger
	items []HistoryItem
	n     uint64
}

func newHistoryLog() *historyLog { return &historyLog{l: ledger.New()} }

// ev applies one event (its stack named by its API), at the next µs,
// to the history too when keep.
func (h *historyLog) ev(api events.API, addr, size uint64, keep bool) {
	h.n++
	e := events.Event{Time: h.n * 1000, PID: 1, Comm: "job", API: api, Addr: addr, Size: size, Stack: []uint64{uint64(api)}}
	ch := h.l.Apply(&e)
	if keep {
		it := HistoryItem{End: e.End(), API: e.API, Result: e.Result, Size: e.Size, Device: e.Device, Change: ch}
		it.Change.Process = nil
		h.items = append(h.items, it)
	}
}
