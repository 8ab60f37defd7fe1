package record

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// eventLog is an Observer that keeps a copy of every event, as a live
// view does.
type eventLog struct{ got []events.Event }

func (l *eventLog) Process(*procmodel.Capture)    {}
func (l *eventLog) Python(uint32, *pystack.Table) {}
func (l *eventLog) Tick(*Result)                  {}
func (l *eventLog) Event(ev *events.Event, _ ledger.Change) {
	c := *ev
	c.Stack, c.Py, c.Window = slices.Clone(ev.Stack), slices.Clone(ev.Py), nil
	l.got = append(l.got, c)
}

// The loader hands the session each record in the ring buffer's own
// memory, and BPF writes the next records over it once the handler has
// returned (loader.Handler). So nothing the session keeps past Record may
// point into raw: here every record comes in one buffer that is scribbled
// over after each call, as the ring wrapping would, and the trace file,
// the ledger and the observer must still hold each event exactly as
// recorded: addresses, sizes, stacks, Python frames, names.
func TestRecordKeepsNothingOfRaw(t *testing.T) {
	var want []events.Event
	win := bytes.Repeat([]byte{0x5a}, 4096)
	for i := range 24 {
		stack := []uint64{0x401000 + uint64(i), 0x402000 + uint64(i%3), 0x403000}
		addr := 0x7f0000000000 + uint64(i)<<20
		al := events.Event{Time: uint64(1000 + 2*i), PID: 42, TID: 43, Comm: fmt.Sprintf("job%d", i%2), API: events.CudaMalloc,
			Addr: addr, Size: uint64(i+1) << 12, Flags: events.FlagWindow, Stack: stack, Regs: events.Regs{SP: 0x7ffd0000}, Window: win}
		if i%4 == 1 { // with Python frames, no window: as BPF lays them out (i == 5: as older traces)
			al.Flags, al.Window, al.Regs = events.FlagPython|events.FlagPyHead, nil, events.Regs{}
			if i == 5 {
				al.Flags = events.FlagPython
			}
			al.Py = []events.PyFrame{{Code: 0x7e0000 + uint64(i), Units: int32(i)}, {Code: 0x7e1000, Units: 7, Flags: events.PyEntry}}
		}
		want = append(want, al)
		if i%3 != 2 { // every third allocation stays live
			want = append(want, events.Event{Time: uint64(1001 + 2*i), PID: 42, TID: 43, Comm: al.Comm, API: events.CudaFree,
				Addr: addr, Flags: events.FlagEntryOnly})
		}
	}

	var out bytes.Buffer
	obs := &eventLog{}
	s := newState(Options{Observer: obs}, &Result{Ledger: ledger.New()})
	defer s.close()
	w, err := NewTraceWriter(&out, TraceMeta("test"))
	if err != nil {
		t.Fatal(err)
	}
	s.w = w
	s.lifeOf(42).rec = &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 42}), exited: true}

	ring := make([]byte, 64<<10)
	for i := range want {
		raw := events.Encode(nil, &want[i])
		n := copy(ring, raw)
		if want[i].Flags&events.FlagPyHead != 0 {
			n += 2048 // the room BPF reserved and the record did not use: last lap's bytes
		}
		s.Record(ring[:n])
		for j := range ring { // BPF's next record
			ring[j] = byte(0xe0 + j%16)
		}
	}
	if err := s.finish(s.res); err != nil {
		t.Fatal(err)
	}

	// The trace: each event as recorded, without its window.
	r, err := tracefile.NewReader(&out)
	if err != nil {
		t.Fatal(err)
	}
	var traced []events.Event
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Event != nil {
			ev := *rec.Event
			ev.Stack, ev.Py, ev.Window = slices.Clone(ev.Stack), slices.Clone(ev.Py), nil
			traced = append(traced, ev)
		}
	}
	same := func(what string, got []events.Event) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d events, want %d", what, len(got), len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Time != w.Time || g.Addr != w.Addr || g.Size != w.Size || g.API != w.API || g.Comm != w.Comm ||
				!slices.Equal(g.Stack, w.Stack) || !slices.Equal(g.Py, w.Py) || g.Flags&^events.FlagWindow != w.Flags&^events.FlagWindow {
				t.Errorf("%s: event %d = %+v\nwant %+v", what, i, g, w)
			}
		}
	}
	same("trace", traced)
	same("observer", obs.got)

	// The ledger: the live allocations with their sizes and native stacks.
	p := s.res.Ledger.Process(42)
	if p == nil {
		t.Fatal("no process 42 in the ledger")
	}
	var live []string
	for _, a := range p.LiveAllocations() {
		live = append(live, fmt.Sprintf("%#x %d %x", a.Addr, a.Size, a.Stack.Frames))
	}
	slices.Sort(live)
	var wantLive []string
	for i := 2; i < 24; i += 3 {
		stack := []uint64{0x401000 + uint64(i), 0x402000 + uint64(i%3), 0x403000}
		wantLive = append(wantLive, fmt.Sprintf("%#x %d %x", 0x7f0000000000+uint64(i)<<20, uint64(i+1)<<12, stack))
	}
	slices.Sort(wantLive)
	if !slices.Equal(live, wantLive) {
		t.Errorf("live allocations:\n%s\nwant:\n%s", live, wantLive)
	}
}
