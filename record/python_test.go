package record

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
)

// pyObserver records what the session hands an observer.
type pyObserver struct {
	tables []*pystack.Table
	stacks [][]uint64 // ev.Stack as each Event got it
}

func (o *pyObserver) Process(*procmodel.Capture)        {}
func (o *pyObserver) Tick(*Result)                      {}
func (o *pyObserver) Python(_ uint32, t *pystack.Table) { o.tables = append(o.tables, t) }
func (o *pyObserver) Event(ev *events.Event, _ ledger.Change) {
	o.stacks = append(o.stacks, slices.Clone(ev.Stack))
}

// Without a trace file the session still resolves a CPython process's
// frames, once each, into the table it hands the observer; the ledger's
// stacks have them merged in, one per Python line, while the observer and
// the trace get the record as captured.
func TestPythonLive(t *testing.T) {
	obs := &pyObserver{}
	s := newState(Options{Observer: obs}, &Result{Ledger: ledger.New()})
	pid := uint32(os.Getpid())
	eval := [][2]uint64{{0x5000, 0x6000}}
	ps := &liveProc{py: &pystack.Interp{Eval: eval}, p: s.procs.Add(&procmodel.Capture{PID: pid})}
	native := []uint64{0x1000, 0x5010, 0x3000}
	record := func(code uint64, units int32, size uint64) ledger.Change {
		ev := &events.Event{PID: pid, API: events.CudaMalloc, Addr: 0x10000 * uint64(units+1), Size: size,
			Flags: events.FlagPython, Stack: slices.Clone(native),
			Py: []events.PyFrame{{Code: code, Units: units, Flags: events.PyEntry}}}
		s.resolvePython(ev, ps)
		ch := s.apply(ev, ps)
		obs.Event(ev, ch)
		return ch
	}
	// Two frames the session has resolved already (as if read before),
	// then one it must read: address 0 is no code object, so it is kept
	// with the error, not read again.
	s.resolvePython(&events.Event{PID: pid, Flags: events.FlagNoPython}, ps)
	if len(obs.tables) != 1 || obs.tables[0] != ps.p.Py || !slices.Equal(ps.p.Py.Eval, eval) {
		t.Fatalf("observer got tables %v, want the process's", obs.tables)
	}
	tb := ps.p.Py
	tb.Put(pystack.Code{Code: 0xc0de, Units: 4, File: "/app/train.py", Function: "forward", Line: 12})
	tb.Put(pystack.Code{Code: 0xc0de, Units: 9, File: "/app/train.py", Function: "forward", Line: 14})
	a := record(0xc0de, 4, 100)
	b := record(0xc0de, 9, 50)
	a2 := record(0xc0de, 4, 10)
	c := record(0, 2, 1)
	record(0, 2, 1)
	if len(obs.tables) != 1 {
		t.Errorf("observer got %d tables, want one", len(obs.tables))
	}
	if tb.Len() != 3 {
		t.Fatalf("table has %d frames, want 3 (the unreadable one once)", tb.Len())
	}
	if f := tb.Frame(c.Stack.Frames[1]); !strings.HasPrefix(f.Function, "[unresolved Python frame: ") || tb.Unresolved() != 1 {
		t.Errorf("unreadable code object named %+v", f)
	}
	if a.Stack == b.Stack || a.Stack != a2.Stack || a.Stack.AllocBytes != 110 || b.Stack.AllocBytes != 50 {
		t.Fatalf("stacks: line 12 %+v, line 14 %+v, line 12 again %+v", a.Stack, b.Stack, a2.Stack)
	}
	if f := tb.Frame(a.Stack.Frames[1]); len(a.Stack.Frames) != 3 || f.Line != 12 || f.File != "/app/train.py" ||
		a.Stack.Frames[0] != 0x1000 || a.Stack.Frames[2] != 0x3000 {
		t.Errorf("ledger stack %x: frame %+v", a.Stack.Frames, f)
	}
	for _, st := range obs.stacks {
		if !slices.Equal(st, native) {
			t.Errorf("observer's event stack %x, want the native %x", st, native)
		}
	}
}

// A record with Python frames from a process whose interpreter the reader
// never read (gone first) has them left out, and counted; one without
// frames, or of a process the reader knows, is not counted.
func TestPythonNoInterpreter(t *testing.T) {
	s := newState(Options{}, &Result{Ledger: ledger.New()})
	pid := uint32(os.Getpid())
	gone := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: pid})}
	py := []events.PyFrame{{Code: 0xc0de, Units: 4, Flags: events.PyEntry}}
	s.resolvePython(&events.Event{PID: pid, Flags: events.FlagPython, Py: py}, gone)
	s.resolvePython(&events.Event{PID: pid, Flags: events.FlagPython, Py: py}, gone)
	s.resolvePython(&events.Event{PID: pid, Flags: events.FlagNoPython}, gone)
	s.resolvePython(&events.Event{PID: pid}, gone)
	if s.pyNoInterp != 2 || gone.p.Py != nil {
		t.Errorf("counted %d records without an interpreter (table %v), want 2 and no table", s.pyNoInterp, gone.p.Py)
	}
}

// An allocation record BPF walked no Python frames for is counted
// (unwalked) where its process runs CPython: one the reader read after BPF
// made the record, and one gone before it could be read whose program is
// named as an interpreter (a python3.X in a root of its own, gone with
// it). Not counted: a free, a record after BPF walked one of the process
// (its layout known: a walk a preempting probe spoiled, which BPF
// counts), a process read while it ran and found running none, another
// program gone, and any with --no-python-frames.
func TestPythonUnwalked(t *testing.T) {
	alloc := func(pid uint32, flags uint16) *events.Event {
		return &events.Event{PID: pid, API: events.CudaMalloc, Flags: flags}
	}
	s := newState(Options{}, &Result{Ledger: ledger.New()})
	late := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 1}), py: &pystack.Interp{}}
	s.resolvePython(alloc(1, 0), late)
	s.resolvePython(&events.Event{PID: 1, API: events.CudaFree}, late)
	s.resolvePython(alloc(1, 0), late)
	if s.pyUnwalked != 2 {
		t.Errorf("a read process's records before BPF walked: counted %d, want 2", s.pyUnwalked)
	}
	s.resolvePython(alloc(1, events.FlagNoPython), late)
	s.resolvePython(alloc(1, 0), late)
	if s.pyUnwalked != 2 {
		t.Errorf("a record after BPF walked one: counted %d in all, want 2", s.pyUnwalked)
	}

	s = newState(Options{}, &Result{Ledger: ledger.New()})
	s.lifeOf(2).exe = "/usr/bin/python3.13"
	gone := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 2, Error: "exited"}), exited: true}
	s.resolvePython(alloc(2, 0), gone)
	goneLib := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 3, Exe: "/opt/app",
		Maps: []proc.Mapping{{Path: "/usr/lib/libpython3.12.so.1.0"}}}), exited: true}
	s.resolvePython(alloc(3, 0), goneLib)
	if s.pyUnwalked != 2 {
		t.Errorf("gone processes named as CPython: counted %d, want 2", s.pyUnwalked)
	}
	s.lifeOf(4).exe = "/usr/bin/python3.13"
	ran := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 4}), pyTried: true}
	s.resolvePython(alloc(4, 0), ran)
	s.lifeOf(5).exe = "/usr/bin/sh"
	other := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 5}), exited: true}
	s.resolvePython(alloc(5, 0), other)
	s.lifeOf(6).exe = "/usr/bin/python3.13t"
	free := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 6}), exited: true}
	s.resolvePython(alloc(6, 0), free)
	if s.pyUnwalked != 2 {
		t.Errorf("processes that run no CPython read: counted %d in all, want 2", s.pyUnwalked)
	}

	s = newState(Options{NoPythonFrames: true}, &Result{Ledger: ledger.New()})
	off := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 1}), py: &pystack.Interp{}}
	s.resolvePython(alloc(1, 0), off)
	if s.pyUnwalked != 0 {
		t.Errorf("--no-python-frames: counted %d, want 0", s.pyUnwalked)
	}
}
