// Package replay reads a trace file back through the ledger, event by
// event, keeping what symbolizing its stacks needs: the mappings each
// process had when a stack was first seen. The report and every export
// are built on one pass (or two, for a moment in the past) of Read, in
// memory bounded by the live set and the distinct stacks, not by the
// number of events.
package replay

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pyframes"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
	"github.com/cudatrace/cudatrace/unwind"
)

// Options tune Read.
type Options struct {
	// Until, when not 0, stops the replay before the first event that takes
	// effect after it (CLOCK_BOOTTIME ns, as events.Event.End): the ledger
	// then holds the live set at that moment.
	Until uint64
	// OnEvent, when set, is called after the ledger has applied each event,
	// with what changed. ev is reused by the next event: copy what must
	// outlive the call. An error stops the replay and is returned by Read.
	OnEvent func(ev *events.Event, ch ledger.Change) error
	// OnNVML, when set, is called for each sample of the driver's view
	// (nvml frame) with the ledger as it stands at that point of the file:
	// the traced live bytes to put beside the driver's. An error stops the
	// replay and is returned by Read.
	OnNVML func(n *tracefile.NVML, l *ledger.Ledger) error
	// FramePointersOnly keeps the frame-pointer stacks as recorded and
	// skips unwinding the records' stack windows from call-frame
	// information.
	FramePointersOnly bool
}

// Trace is a trace file replayed: the ledger at the end (or at
// Options.Until) and what else the file said.
type Trace struct {
	Path      string
	Meta      tracefile.Meta
	Ledger    *ledger.Ledger
	Events    uint64 // event records applied
	Lost      uint64 // events the BPF side counted as lost
	Counters  map[string]uint64
	Libraries []tracefile.Attach
	End       *tracefile.End // nil: the tracer did not stop cleanly
	Last      uint64         // latest time recorded (boot ns)
	// Warning says why the replay stopped short of the file's end (a
	// truncated or damaged trace), or that the end record is missing.
	Warning string

	// Processes holds each PID's first capture, with the mappings it had then.
	Processes map[uint32]*tracefile.Process
	// Latest holds each PID's latest capture.
	Latest map[uint32]*tracefile.Process

	// Unwound says how the stacks of records with a stack window came out.
	Unwound UnwindStats

	// The capture each stack is read against (nil: none came).
	stackProcs map[*ledger.Stack]*tracefile.Process
	// Stacks first seen before any capture of their process: they take
	// the first capture that comes.
	pending map[uint32][]*ledger.Stack
	py      map[uint32]*pyframes.Table // CPython processes' frames (python.go)
	// Native frames of container processes named at record time.
	symbols []tracefile.Symbol
}

// Read replays the trace at path. A trace cut short (the tracer was killed)
// or damaged part way is replayed up to the damage, with Warning saying so;
// a file that is not a trace, or of a later format version, is an error.
func Read(path string, opts Options) (*Trace, error) {
	r, err := tracefile.Open(path)
	if err != nil {
		return nil, err // Open names the path
	}
	defer r.Close()
	var uw *unwinder
	if !opts.FramePointersOnly {
		uw = newUnwinder()
		defer uw.Close()
	}

	t := &Trace{
		Path:       path,
		Meta:       r.Meta(),
		Ledger:     ledger.New(),
		Counters:   map[string]uint64{},
		Processes:  map[uint32]*tracefile.Process{},
		Latest:     map[uint32]*tracefile.Process{},
		stackProcs: map[*ledger.Stack]*tracefile.Process{},
		pending:    map[uint32][]*ledger.Stack{},
	}
	for {
		rec, err := r.Next()
		switch {
		case err == io.EOF:
			t.finish()
			return t, nil
		case errors.Is(err, tracefile.ErrTruncated):
			t.Warning = fmt.Sprintf("trace truncated: %s (the tracer was killed, or the disk filled); what follows covers the events before it",
				cause(err, tracefile.ErrTruncated))
			return t, nil
		case errors.Is(err, tracefile.ErrCorrupt):
			t.Warning = fmt.Sprintf("trace damaged: %s; what follows covers the events before it",
				cause(err, tracefile.ErrCorrupt))
			return t, nil
		case err != nil:
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			ev := rec.Event
			if opts.Until != 0 && ev.End() > opts.Until {
				// Events reach the file in ring-buffer order, close to but
				// not strictly by time: one from another CPU may still be
				// due. Skip, don't stop.
				continue
			}
			t.Events++
			t.Last = max(t.Last, ev.End())
			if uw != nil && ev.Flags&events.FlagWindow != 0 {
				uw.unwind(ev, t.Latest[ev.PID], &t.Unwound)
			}
			t.mergePython(ev)
			ch := t.Ledger.Apply(ev)
			if ch.Stack != nil {
				t.noteStack(ev.PID, ch.Stack)
			}
			if opts.OnEvent != nil {
				if err := opts.OnEvent(ev, ch); err != nil {
					return nil, err
				}
			}
		case tracefile.TypeProcess:
			t.capture(rec.Process)
		case tracefile.TypePython:
			t.python(rec.Python)
		case tracefile.TypeSymbols:
			t.symbols = append(t.symbols, rec.Symbols.Frames...)
		case tracefile.TypeAttach:
			t.Libraries = append(t.Libraries, *rec.Attach)
		case tracefile.TypeCounters:
			if rec.Counters.Counters != nil {
				t.Counters = rec.Counters.Counters
			}
			t.Lost = rec.Counters.Lost
			t.Last = max(t.Last, rec.Counters.Time)
		case tracefile.TypeEnd:
			t.End = rec.End
			t.Last = max(t.Last, rec.End.Time)
		case tracefile.TypeNVML:
			if opts.Until != 0 && rec.NVML.Time > opts.Until {
				continue
			}
			t.Last = max(t.Last, rec.NVML.Time)
			if opts.OnNVML != nil {
				if err := opts.OnNVML(rec.NVML, t.Ledger); err != nil {
					return nil, err
				}
			}
		}
	}
}

func (t *Trace) finish() {
	if t.End == nil {
		t.Warning = "no end record: the tracer did not stop cleanly (killed?); what follows covers what it wrote"
	}
}

// noteStack remembers the mappings a stack is to be symbolized with: its
// process's as they were when the stack was first seen. A later capture
// (after a dlopen or an exec) describes the addresses of later events.
func (t *Trace) noteStack(pid uint32, st *ledger.Stack) {
	if _, seen := t.stackProcs[st]; seen {
		return
	}
	p, ok := t.Latest[pid]
	if !ok {
		t.stackProcs[st] = nil
		t.pending[pid] = append(t.pending[pid], st)
		return
	}
	t.stackProcs[st] = p
}

func (t *Trace) capture(p *tracefile.Process) {
	t.Latest[p.PID] = p
	if _, ok := t.Processes[p.PID]; !ok {
		t.Processes[p.PID] = p
	}
	for _, st := range t.pending[p.PID] {
		t.stackProcs[st] = p
	}
	delete(t.pending, p.PID)
	t.Last = max(t.Last, p.Time)
}

// Maps returns the mappings st's addresses are to be read against; nil
// when its process was never captured.
func (t *Trace) Maps(st *ledger.Stack) []proc.Mapping {
	if p := t.stackProcs[st]; p != nil {
		return p.Maps
	}
	return nil
}

// SymbolProc says whose files the mappings of capture p name, for
// symbolize.FramesOf.
func SymbolProc(p *tracefile.Process) symbolize.Proc {
	if p == nil {
		return symbolize.Proc{}
	}
	return symbolize.Proc{PID: int(p.PID), Start: p.Start, OwnRoot: p.OwnRoot}
}

// DurationNS is the time from the start of the recording to the last thing
// it recorded.
func (t *Trace) DurationNS() uint64 {
	if t.Last > t.Meta.StartBoot {
		return t.Last - t.Meta.StartBoot
	}
	return 0
}

// Symbols symbolizes a trace's stacks, each once.
type Symbols struct {
	t    *Trace
	sym  *symbolize.Symbolizer // nil: addresses only
	done map[*ledger.Stack][]symbolize.Frame
}

// Symbols returns a symbolizer for t's stacks. With enabled false, frames
// carry only their addresses (and modules are not opened). Close it when
// done.
func (t *Trace) Symbols(enabled bool) *Symbols {
	s := &Symbols{t: t, done: map[*ledger.Stack][]symbolize.Frame{}}
	if enabled {
		s.sym = symbolize.New()
		for _, k := range t.symbols {
			s.sym.Known(k.BuildID, k.Offset, symbolize.Frame{Function: k.Function, File: k.File, Line: k.Line, Offset: k.VAddr})
		}
	}
	return s
}

// Frames returns st's frames, innermost first; an empty slice for nil.
func (s *Symbols) Frames(st *ledger.Stack) []symbolize.Frame {
	if st == nil {
		return []symbolize.Frame{}
	}
	if f, ok := s.done[st]; ok {
		return f
	}
	f := s.sym.FramesOf(SymbolProc(s.t.stackProcs[st]), s.t.Maps(st), st.Frames)
	s.t.pythonFrames(st.PID, f)
	s.done[st] = f
	return f
}

// Gone is how many frames of processes in containers, gone by now, no
// file with their build ID could name (symbolize.Symbolizer.Gone).
func (s *Symbols) Gone() uint64 {
	if s.sym == nil {
		return 0
	}
	return s.sym.Gone()
}

// GoneHint is what a user can do about frames counted by Gone.
const GoneHint = "their processes ran in containers and have exited, and this host holds other files (or none) at their paths: " +
	"run this while the job still runs, or install the debug files of those build IDs under /usr/lib/debug/.build-id"

// Close drops the caches and closes the files the symbolizer opened.
func (s *Symbols) Close() error {
	if s.sym == nil {
		return nil
	}
	return s.sym.Close()
}

// cause is err's text without the sentinel it wraps, which the warning
// says in its own words.
func cause(err, sentinel error) string {
	return strings.TrimSuffix(err.Error(), ": "+sentinel.Error())
}

// UnwindStats counts what unwinding the records' stack windows did.
type UnwindStats struct {
	Events   uint64 // records with a stack window
	Deeper   uint64 // whose stack the call-frame unwind made deeper than the frame-pointer walk
	Stops    map[unwind.StopKind]uint64
	LastStop map[unwind.StopKind]string // an example of each kind of stop, for a warning
}

// unwinder unwinds records' stack windows against their process's
// mappings, and puts the deeper of that and the frame-pointer stack in the
// event before the ledger sees it.
type unwinder struct {
	u    *unwind.Unwinder
	maps map[*tracefile.Process]*unwind.Maps
	pcs  []uint64
}

func newUnwinder() *unwinder {
	return &unwinder{u: unwind.New(), maps: map[*tracefile.Process]*unwind.Maps{}}
}

func (w *unwinder) Close() error { return w.u.Close() }

// unwindFiles returns p's mappings with the paths of the files that hold
// their call-frame information: a container's own through /proc/PID/root
// while it lives; once it is gone, only host files with the build ID it
// mapped (another build's CFI would unwind wrong).
func unwindFiles(p *tracefile.Process) []proc.Mapping {
	if !p.OwnRoot {
		return p.Maps
	}
	live := SymbolProc(p).Live()
	var out []proc.Mapping
	for _, m := range p.Maps {
		switch {
		case live:
			m.Path = proc.RootPath(int(p.PID), m.Path)
		case m.BuildID == "":
			continue
		default:
			if id, _ := symbolize.BuildID(m.Path); !strings.EqualFold(id, m.BuildID) {
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

func (w *unwinder) unwind(ev *events.Event, p *tracefile.Process, st *UnwindStats) {
	st.Events++
	if p == nil || len(p.Maps) == 0 || len(ev.Window) == 0 {
		return
	}
	m := w.maps[p]
	if m == nil {
		m = unwind.NewMaps(unwindFiles(p))
		w.maps[p] = m
	}
	// At a return probe the instruction pointer is a return address; a
	// USDT probe (recorded at entry) sits inside its function.
	ipReturn := ev.Flags&events.FlagEntryOnly == 0
	var stop unwind.Stop
	w.pcs, stop = w.u.Unwind(m, ev.Regs, ev.Window, ipReturn, w.pcs[:0])
	if st.Stops == nil {
		st.Stops = map[unwind.StopKind]uint64{}
		st.LastStop = map[unwind.StopKind]string{}
	}
	st.Stops[stop.Kind]++
	st.LastStop[stop.Kind] = stop.Detail
	merged := unwind.Merge(ev.Stack, w.pcs, stop)
	if len(merged) > len(ev.Stack) {
		st.Deeper++
	}
	ev.Stack = append(ev.Stack[:0], merged...)
}
