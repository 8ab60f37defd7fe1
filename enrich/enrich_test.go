package enrich

import (
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
)

// The ledger keeps the stack with the Python frames in place of the
// interpreter loop's frame; the event keeps its native stack; a thread
// without Python frames ends with NoPythonAddr; without a table the
// stack is the native one.
func TestApplyPython(t *testing.T) {
	e := New(false)
	defer e.Close()
	l := ledger.New()
	tb := pystack.NewTable([][2]uint64{{0x5000, 0x6000}})
	addr := tb.Put(pystack.Code{Code: 0xc0de, Units: 4, File: "/app/train.py", Function: "step", Line: 3})
	native := []uint64{0x1000, 0x5010, 0x3000}
	ev := &events.Event{PID: 7, API: events.CudaMalloc, Addr: 0x10000, Size: 10, Flags: events.FlagPython,
		Stack: slices.Clone(native), Py: []events.PyFrame{{Code: 0xc0de, Units: 4, Flags: events.PyEntry}}}
	ch := e.Apply(l, ev, tb)
	if want := []uint64{0x1000, addr, 0x3000}; ch.Stack == nil || !slices.Equal(ch.Stack.Frames, want) {
		t.Fatalf("ledger stack %+v, want frames %x", ch.Stack, want)
	}
	if !slices.Equal(ev.Stack, native) {
		t.Errorf("event stack %x, want the native %x", ev.Stack, native)
	}
	ev2 := &events.Event{PID: 7, API: events.CudaMalloc, Addr: 0x20000, Size: 10, Flags: events.FlagNoPython, Stack: slices.Clone(native)}
	if ch := e.Apply(l, ev2, tb); !slices.Equal(ch.Stack.Frames, append(slices.Clone(native), pystack.NoPythonAddr)) {
		t.Errorf("no-Python stack %x", ch.Stack.Frames)
	}
	ev3 := &events.Event{PID: 8, API: events.CudaMalloc, Addr: 0x30000, Size: 10, Flags: events.FlagPython, Stack: slices.Clone(native)}
	if ch := e.Apply(l, ev3, nil); !slices.Equal(ch.Stack.Frames, native) {
		t.Errorf("stack without a table %x, want %x", ch.Stack.Frames, native)
	}
}

// Without call-frame unwinding, or without a window, Unwind leaves the
// stack alone; with unwinding, a record of a process never captured is
// counted and keeps its frame-pointer stack.
func TestUnwindNothingToDo(t *testing.T) {
	fp := New(false)
	ev := &events.Event{PID: 1, Flags: events.FlagWindow, Window: make([]byte, 64), Stack: []uint64{1, 2}}
	fp.Unwind(ev, &procmodel.Capture{PID: 1})
	if fp.Stats.Events != 0 || !slices.Equal(ev.Stack, []uint64{1, 2}) {
		t.Errorf("frame pointers only: stats %+v, stack %x", fp.Stats, ev.Stack)
	}
	e := New(true)
	defer e.Close()
	e.Unwind(ev, nil)
	e.Unwind(&events.Event{PID: 1, Stack: []uint64{3}}, nil) // no window
	if e.Stats.Events != 1 || e.Stats.Deeper != 0 || !slices.Equal(ev.Stack, []uint64{1, 2}) {
		t.Errorf("stats %+v, stack %x", e.Stats, ev.Stack)
	}
}
