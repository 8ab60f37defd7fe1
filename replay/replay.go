// Package replay reads a trace file back through the ledger, event by
// event, through the same enrichment as the live session (package enrich),
// keeping in a process model (package procmodel) what symbolizing its
// stacks needs: the mappings each process had when a stack was first seen.
// The report and every export are built on one pass (or two, for a moment
// in the past) of Read, in memory bounded by the live set and the distinct
// stacks, not by the number of events. docs/architecture.md places it
// among the other packages.
package replay

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/enrich"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
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
	// (nvml frame) with the ledger as it stood when the sample was taken:
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
	Path   string
	Meta   tracefile.Meta
	Ledger *ledger.Ledger
	Events uint64 // event records applied
	Lost   uint64 // events the BPF side counted as lost
	// LostStopping: of Lost, those counted after the stop began.
	LostStopping uint64
	Counters     map[string]uint64
	Libraries    []tracefile.Attach
	End          *tracefile.End // nil: the tracer did not stop cleanly
	Last         uint64         // latest time recorded (boot ns)
	// Warning says why the replay stopped short of the file's end (a
	// truncated or damaged trace), or that the end record is missing.
	Warning string

	skippedLast uint64 // the latest time of the records Until left out

	// Procs is what the file says of each process: its captures, its
	// Python frames' table, and the capture each stack is read against.
	Procs *procmodel.Processes

	// Unwound says how the stacks of records with a stack window came out.
	Unwound enrich.Stats

	// Native frames named at record time (processes in containers, or
	// every process with record --portable).
	symbols []procmodel.Symbol
}

// First returns pid's first capture (the command line at its start); nil
// when none was recorded.
func (t *Trace) First(pid uint32) *procmodel.Capture {
	if p := t.Procs.Get(pid); p != nil {
		return p.First
	}
	return nil
}

// Latest returns pid's latest capture; nil when none was recorded.
func (t *Trace) Latest(pid uint32) *procmodel.Capture {
	if p := t.Procs.Get(pid); p != nil {
		return p.Latest
	}
	return nil
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
	en := enrich.New(!opts.FramePointersOnly)
	defer en.Close()

	t := &Trace{
		Path:     path,
		Meta:     r.Meta(),
		Ledger:   ledger.New(),
		Counters: map[string]uint64{},
		Procs:    procmodel.New(),
	}
	defer func() { t.Unwound = en.Stats }()
	// A sample reaches the file when the reader takes it, and records that
	// came before it may still be in the ring then: a free made just
	// before the sample is written after it (seen on an H100: a 1 GiB
	// free 25 ms before a sample made the traced bytes exceed the driver's
	// by 578 MiB). So a sample waits here for the first event that took
	// effect after it and sees the ledger as it stood at its time.
	samples := nvmlQueue{f: opts.OnNVML, l: t.Ledger}
	done := func() (*Trace, error) {
		if err := samples.flush(^uint64(0)); err != nil {
			return nil, err
		}
		return t, nil
	}
	for {
		rec, err := r.Next()
		switch {
		case err == io.EOF:
			t.finish()
			return done()
		case errors.Is(err, tracefile.ErrTruncated):
			t.Warning = fmt.Sprintf("trace truncated: %s (the tracer was killed, or the disk filled); what follows covers the events before it",
				cause(err, tracefile.ErrTruncated))
			return done()
		case errors.Is(err, tracefile.ErrCorrupt):
			t.Warning = fmt.Sprintf("trace damaged: %s; what follows covers the events before it",
				cause(err, tracefile.ErrCorrupt))
			return done()
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
				t.skippedLast = max(t.skippedLast, ev.End())
				continue
			}
			if err := samples.flush(ev.End()); err != nil {
				return nil, err
			}
			t.Events++
			t.Last = max(t.Last, ev.End())
			en.Unwind(ev, t.Procs.Get(ev.PID).Current())
			ch := en.Apply(t.Ledger, ev, t.Procs.Python(ev.PID))
			if ch.Stack != nil {
				t.Procs.Bind(ev.PID, ch.Stack)
			}
			if opts.OnEvent != nil {
				if err := opts.OnEvent(ev, ch); err != nil {
					return nil, err
				}
			}
		case tracefile.TypeProcess:
			t.Procs.Add(procmodel.FromFile(rec.Process))
			t.Last = max(t.Last, rec.Process.Time)
		case tracefile.TypePython:
			t.Procs.PythonFromFile(rec.Python)
		case tracefile.TypeSymbols:
			t.symbols = append(t.symbols, procmodel.SymbolsFromFile(rec.Symbols.Frames)...)
		case tracefile.TypeAttach:
			t.Libraries = append(t.Libraries, *rec.Attach)
		case tracefile.TypeCounters:
			if rec.Counters.Counters != nil {
				t.Counters = rec.Counters.Counters
			}
			t.Lost, t.LostStopping = rec.Counters.Lost, rec.Counters.LostStopping
			t.Last = max(t.Last, rec.Counters.Time)
		case tracefile.TypeEnd:
			t.End = rec.End
			t.Last = max(t.Last, rec.End.Time)
		case tracefile.TypeNVML:
			if opts.Until != 0 && rec.NVML.Time > opts.Until {
				t.skippedLast = max(t.skippedLast, rec.NVML.Time)
				continue
			}
			t.Last = max(t.Last, rec.NVML.Time)
			if err := samples.add(rec.NVML); err != nil {
				return nil, err
			}
		}
	}
}

// nvmlQueue holds the samples read whose time no event has passed yet, in
// the order of the file (the order they were taken), and hands each to f
// with the ledger l once it is due.
type nvmlQueue struct {
	f       func(*tracefile.NVML, *ledger.Ledger) error // nil: no one wants samples
	l       *ledger.Ledger
	waiting []*tracefile.NVML
}

// maxWaitingSamples bounds the queue: a minute of samples at the default
// second apart, longer than any record stays unread in the ring (the
// reader polls every 50 ms). A trace with no event for longer hands its
// oldest samples over with the ledger as it stands.
const maxWaitingSamples = 64

func (q *nvmlQueue) add(n *tracefile.NVML) error {
	if q.f == nil {
		return nil
	}
	if len(q.waiting) == maxWaitingSamples {
		if err := q.f(q.waiting[0], q.l); err != nil {
			return err
		}
		q.waiting = q.waiting[1:]
	}
	q.waiting = append(q.waiting, n)
	return nil
}

// flush hands over the samples taken before before (boot ns), with the
// ledger as it stands: every event that took effect earlier is in it.
func (q *nvmlQueue) flush(before uint64) error {
	for len(q.waiting) > 0 && q.waiting[0].Time < before {
		if err := q.f(q.waiting[0], q.l); err != nil {
			return err
		}
		q.waiting = q.waiting[1:]
	}
	return nil
}

func (t *Trace) finish() {
	if t.End == nil {
		// A disk that filled can cut the file at a frame's end as well as
		// inside one: the same causes as a truncated trace's.
		t.Warning = "no end record: the tracer did not stop cleanly (it was killed, or the disk filled); what follows covers what it wrote"
	}
}

// Maps returns the mappings st's addresses are to be read against; nil
// when its process was never captured.
func (t *Trace) Maps(st *ledger.Stack) []proc.Mapping {
	return t.Procs.CaptureOf(st).Mappings()
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
		procmodel.Teach(s.sym, t.symbols)
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
	f := s.t.Procs.Frames(s.sym, st)
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

// CheckPIDs returns an error naming the first of pids the trace has no
// process of (no event, no capture), with the PIDs it has; nil when all
// are there. A --pid that matches nothing is a mistake to say, not an
// empty output.
func (t *Trace) CheckPIDs(pids []uint32) error {
	for _, pid := range pids {
		if t.Ledger.Process(pid) == nil && t.First(pid) == nil {
			var have []string
			for _, p := range t.Ledger.Processes() {
				have = append(have, strconv.FormatUint(uint64(p.PID), 10))
			}
			if len(have) == 0 {
				return hint.Wrap(fmt.Errorf("pid %d is not in the trace, which has no process", pid), "leave --pid out")
			}
			return hint.Wrap(fmt.Errorf("pid %d is not in the trace", pid), "the trace has pid "+strings.Join(have, ", "))
		}
	}
	return nil
}

// PastEnd reports whether until (a replay's Options.Until, CLOCK_BOOTTIME
// ns) lies after every record of the file: a moment the trace never
// reached.
func (t *Trace) PastEnd(until uint64) bool {
	return until != 0 && max(t.Last, t.skippedLast) < until
}
