// Package enrich turns a record as BPF captured it into the event the
// ledger keeps: the stack unwound from the record's stack window with
// call-frame information (package unwind) where that goes deeper than the
// frame-pointer walk, and the CPython frames merged in where the
// interpreter loop stands (package pystack). The live session (record)
// and the replay of a trace (replay) both call it, against the process
// model's capture (procmodel), so a stack comes out the same either way.
// Naming the frames is procmodel.Frames.
//
// docs/architecture.md places it among the other packages.
package enrich

import (
	"fmt"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/unwind"
)

// Enricher enriches one stream of events (a session's, or a replay's).
// It is not safe for concurrent use.
type Enricher struct {
	uw   *unwind.Unwinder // nil: frame-pointer stacks only
	maps map[uint32]capMaps
	// last is maps[lastPID], the last one Unwind used (c nil: none):
	// a look-up a record, for records of one process in a row.
	lastPID uint32
	last    capMaps
	pcs     []uint64
	// merged holds the stack Apply hands the ledger, Python frames
	// merged in.
	merged []uint64
	// Stats says how the stacks of records with a stack window came out.
	Stats Stats
}

// capMaps is a process's mappings ready for the unwinder, built once per
// capture.
type capMaps struct {
	c *procmodel.Capture
	m *unwind.Maps
}

// Stats counts what unwinding the records' stack windows did.
type Stats struct {
	Events uint64 // records with a stack window
	Deeper uint64 // whose stack the call-frame unwind made deeper than the frame-pointer walk
	// Cut counts stacks unwound to the end of their window and no
	// further: a larger window reaches deeper.
	Cut uint64
	// BPF counts records whose stack BPF unwound (events.FlagUnwound).
	// Of those that carry a window too (--keep-stack-windows), BPFSame
	// were unwound here to the same frames, BPFDiffer to others (the
	// first in FirstDiffer), and BPFUnchecked not to the stack's end
	// (their window ended first).
	BPF, BPFSame, BPFDiffer, BPFUnchecked uint64
	FirstDiffer                           string
	// Stops counts the unwinds by how they stopped, and LastStop has an
	// example of each kind, for a warning (String); both indexed by
	// unwind.StopKind. Arrays: they were two maps, each updated at every
	// record.
	Stops    [unwind.NumStopKinds]uint64
	LastStop [unwind.NumStopKinds]unwind.Stop
}

// New returns an Enricher; with cfi false it leaves stacks as the frame
// pointers gave them. Close it when done.
func New(cfi bool) *Enricher {
	// pcs has room for the deepest stack Merge makes: a record's unwind
	// allocates nothing.
	e := &Enricher{maps: map[uint32]capMaps{}, pcs: make([]uint64, 0, unwind.MaxFrames)}
	if cfi {
		e.uw = unwind.New()
	}
	return e
}

// Unwinds reports whether e unwinds stack windows.
func (e *Enricher) Unwinds() bool { return e.uw != nil }

// Close closes the files the unwinder holds open.
func (e *Enricher) Close() error {
	if e.uw == nil {
		return nil
	}
	return e.uw.Close()
}

// Forget drops what e keeps of pid (its mappings ready for unwinding).
func (e *Enricher) Forget(pid uint32) {
	delete(e.maps, pid)
	if e.lastPID == pid {
		e.last = capMaps{}
	}
}

// Unwind replaces the stack of ev, a record with a stack window
// (events.FlagWindow), with the deeper of its frame-pointer walk and the
// call-frame unwind of its window against c, the capture of its process
// current now. The files are opened as c says (Capture.UnwindFiles): a
// container's own while it lives. ev keeps its window.
func (e *Enricher) Unwind(ev *events.Event, c *procmodel.Capture) {
	if ev.Flags&events.FlagUnwound != 0 {
		e.Stats.BPF++
	}
	if e.uw == nil || ev.Flags&events.FlagWindow == 0 {
		return
	}
	e.Stats.Events++
	if c == nil || len(c.Maps) == 0 || len(ev.Window) == 0 {
		return
	}
	cm := e.last
	if cm.c == nil || e.lastPID != ev.PID {
		cm = e.maps[ev.PID]
	}
	if cm.c != c {
		cm = capMaps{c, unwind.NewMaps(c.UnwindFiles())}
		e.maps[ev.PID] = cm
	}
	e.lastPID, e.last = ev.PID, cm
	// At a return probe the instruction pointer is a return address; a
	// USDT probe (recorded at entry) sits inside its function.
	ipReturn := ev.Flags&events.FlagEntryOnly == 0
	var stop unwind.Stop
	e.pcs, stop = e.uw.Unwind(cm.m, ev.Regs, ev.Window, ipReturn, e.pcs[:0])
	e.Stats.Stops[stop.Kind]++
	e.Stats.LastStop[stop.Kind] = stop
	if ev.Flags&events.FlagUnwound != 0 {
		e.check(ev, stop)
	}
	merged := unwind.Merge(ev.Stack, e.pcs, stop)
	if len(merged) > len(ev.Stack) {
		e.Stats.Deeper++
	}
	if stop.Kind == unwind.StopWindow && len(merged) == len(e.pcs) {
		e.Stats.Cut++
	}
	ev.Stack = append(ev.Stack[:0], merged...)
}

// check compares the stack BPF unwound (ev.Stack, with its window: the
// unwind check) with the window's unwound here (e.pcs, stopped by stop),
// the reference: where this one reached the stack's end (or the most
// frames), they must be the same frame for frame.
func (e *Enricher) check(ev *events.Event, stop unwind.Stop) {
	if stop.Kind != unwind.StopEnd && stop.Kind != unwind.StopMax {
		e.Stats.BPFUnchecked++
		return
	}
	if slices.Equal(ev.Stack, e.pcs) {
		e.Stats.BPFSame++
		return
	}
	e.Stats.BPFDiffer++
	if e.Stats.FirstDiffer == "" {
		e.Stats.FirstDiffer = fmt.Sprintf("pid %d: BPF unwound %x, the window %x (%s)", ev.PID, ev.Stack, e.pcs, stop)
	}
}

// Apply hands ev to ledger l with its Python frames merged into its stack
// from py (the process's table; nil: none), so that stacks that differ
// only in their Python frames stay apart and name their Python lines. A
// thread of a CPython process without Python frames ends with
// pystack.NoPythonAddr. ev keeps its native stack: the trace and the
// observers get the record as captured.
func (e *Enricher) Apply(l *ledger.Ledger, ev *events.Event, py *pystack.Table) ledger.Change {
	if py == nil || ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		return l.Apply(ev)
	}
	merged, ok := py.Stack(e.merged[:0], ev)
	if !ok {
		return l.Apply(ev)
	}
	e.merged = merged
	native := ev.Stack
	ev.Stack = merged // the ledger copies the frames of a stack it keeps
	ch := l.Apply(ev)
	ev.Stack = native
	return ch
}
