package record

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cudatrace/cudatrace/enrich"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// counterEvery is how often a counters snapshot goes to the trace, so a
// killed tracer's file still says what was lost up to then.
const counterEvery = time.Second

// jobWarning keys the one warning that a process's environment, where its
// job and rank are, could not be read.
const jobWarning = "job"

// recaptureEvery rate-limits re-reading a process's maps when its stacks
// point outside every mapping we know (a library dlopen'ed late).
const recaptureEvery = 200 * time.Millisecond

// session is the loader's Handler for one recording: it decodes records,
// enriches them (package enrich), feeds the ledger and writes the trace.
type session struct {
	opts   Options
	res    *Result
	tr     *loader.Tracer
	uw     *uwTables    // the rows BPF unwinds with (nil: none)
	w      *TraceWriter // nil without -o
	ev     events.Event
	events uint64

	// procs is what is known of each process: its captures, its Python
	// frames' table, the capture each stack is read against.
	procs *procmodel.Processes
	// lives is what the session itself keeps of each process from its
	// birth to its end (life.go): the one owner of a process's state.
	lives map[uint32]*life
	// lastPID's life is lastLife, the last lifeOf gave (nil: none).
	lastPID  uint32
	lastLife *life
	ids      procmodel.BuildIDs

	// en unwinds the records' stack windows as they come (unless
	// Options.KeepStackWindows leaves that to replay) and merges their
	// Python frames into the ledger's stacks; buf holds a record
	// re-encoded without its window.
	en  *enrich.Enricher
	buf []byte

	child  *child
	stop   func()
	reason string

	lastCounters time.Time
	mark         stopMark // the counters when the stop began
	scanner      *scanner // finds libraries loaded late
	lastSweep    time.Time
	lastBPFSweep time.Time
	libs         loader.Libraries // every library attached, by inode
	warned       map[string]bool
	// attaching are the loaders' attaches under way off the reader's
	// goroutine (notes.go attachLoader), refusals their refusals for it,
	// and the probed files' passes and ends (probed.go).
	attaching sync.WaitGroup
	refusals  chan error
	probed    probedFiles
	sampler   *sampler    // nil without Options.NVML
	maps      *mapCounter // nil without an Observer
	namer     *namer      // names container processes' frames; nil until one is seen
	// pyFrames and pyUnresolved count the Python frames named, and those
	// that stayed unresolved; pyCaptured the code objects BPF captured,
	// pyRead the frames named from the process's memory instead (Result).
	pyFrames, pyUnresolved, pyCaptured, pyRead uint64
	// pyNoInterp counts the records whose Python frames were left out:
	// their process's interpreter was never read (Result.PythonNoInterp).
	pyNoInterp uint64
	// pyUnwalked counts the allocation records of CPython processes
	// that BPF walked no Python frames for: made before the reader had
	// read their interpreter (Result.PythonUnwalked).
	pyUnwalked uint64
	// uncaptured counts the processes gone before their mappings could
	// be read (Result.Uncaptured).
	uncaptured uint64
	// noteReads counts the reads of mappings notes made since the last
	// tick (noteReadsPerTick).
	noteReads int
	// open: a run of one process's library-load notes not taken yet.
	open openNote
	// paused: the reader was held once (testReaderPause).
	paused bool
	// targets are the --pid processes, by their start times: the session
	// ends when none of them is running (targetAlive).
	targets map[int]uint64
	// pyFiles are the interpreter files whose layout BPF has (python.go).
	pyFiles *pyFileSet
	// learn decides when the tracer's learning probes are on.
	learn learning
	// stats times the steps of Record (Options.ReaderStats); nil: not.
	stats *ReaderStats
	// gc holds the collector's settings for the recording
	// (Options.GCHeadroom); nil: Go's own.
	gc *gcTuner
}

// liveProc is what the session keeps of a running process beside the
// model: when it last read its mappings, and the CPython interpreter it
// found there.
type liveProc struct {
	p *procmodel.Process // the model's, set by the first capture
	// captured is when the process was last captured or its mappings read:
	// the time (CLOCK_BOOTTIME ns) of the record that led to it.
	captured uint64
	exited   bool
	// missPC is an address of a stack that missCap, a capture of the
	// process, does not cover: CPython's stacks carry the same stray ones
	// record after record (below), each costing a search of every mapping.
	missPC  uint64
	missCap *procmodel.Capture
	// okStack is the last stack found covered by okCap: the stack just
	// unwound, checked again (enrich), is most often the last one.
	okStack   []uint64
	okCap     *procmodel.Capture
	recapture int
	// quiet counts the reads of the process's mappings since its last
	// capture that found the same files mapped: each doubles the wait
	// before the next, up to 8 times recaptureEvery.
	quiet   int
	py      *pystack.Interp // nil: no CPython found (yet)
	pyTried bool
	// codes are the process's code objects BPF captured (python.go).
	codes pystack.Captures
	// walked: BPF has walked a record of its (it has the layout) since
	// its last exec: a later record without frames is not one made
	// before the layout was known (python.go unwalked).
	walked bool
	// namedPy: gone, its program or a file it mapped is named as an
	// interpreter cudatrace reads (python.go unwalked); 0 not told yet,
	// 1 yes, -1 no. Told once: a process gone is captured no more.
	namedPy int8
	// execd: it ran another program since its last capture (notes.go).
	execd bool
}

// newState returns a session's state, with no trace file.
func newState(opts Options, res *Result) *session {
	s := &session{
		opts: opts, res: res,
		procs:    procmodel.New(),
		lives:    make(map[uint32]*life),
		warned:   make(map[string]bool),
		refusals: make(chan error, 16),
		en:       enrich.New(!opts.KeepStackWindows || unwindCheck),
	}
	if opts.ReaderStats {
		s.stats = &ReaderStats{}
	}
	return s
}

func newSession(opts Options, res *Result, tr *loader.Tracer) (*session, error) {
	s := newState(opts, res)
	s.tr = tr
	if tr.Unwinds() {
		s.uw = newUWTables(tr)
	}
	if opts.Output == "" {
		return s, nil
	}
	meta := TraceMeta("cudatrace " + opts.Version)
	meta.Command, meta.PIDs, meta.All = opts.Command, opts.PIDs, opts.All
	w, err := CreateTrace(opts.Output, meta)
	if err != nil {
		s.en.Close()
		return nil, err
	}
	s.w = w
	return s, nil
}

func (s *session) warn(err error) {
	msg := err.Error()
	if s.warned[msg] {
		return
	}
	s.warned[msg] = true
	fmt.Fprintf(s.opts.Stderr, "cudatrace: warning: %s\n", msg)
}

func (s *session) writeAttach(ar loader.AttachResult, late *tracefile.Attach) {
	s.libs.Add(ar.Library.Path)
	if s.w == nil {
		return
	}
	id, _ := symbolize.BuildID(ar.Library.Path)
	a := &tracefile.Attach{Library: ar.Library.Path, BuildID: id, Symbols: ar.Symbols, Missing: ar.Missing}
	if late != nil {
		a.Time, a.PID, a.EventsBefore, a.Loaded = late.Time, late.PID, late.EventsBefore, late.Loaded
	}
	if err := s.w.WriteAttach(a); err != nil {
		s.warn(err)
	}
}

// Record handles one ring-buffer record, in named steps (each timed with
// Options.ReaderStats).
func (s *session) Record(raw []byte) {
	st := s.stats
	st.begin()
	if err := events.Decode(raw, &s.ev); err != nil {
		s.warn(err)
		return
	}
	ev := &s.ev
	if ev.API.Info().Op == events.OpNote {
		s.note(raw, ev)
		return
	}
	s.takeOpenNote()
	if ev.API == events.ProcessExit && ev.Flags&events.FlagNotesOnly != 0 {
		// A process that made no record of its own, only notes: its
		// end is the session's alone, nothing of it in the ledger or
		// the trace.
		s.end(ev.PID)
		return
	}
	s.events++
	lp := s.track(ev)
	st.done(StageDecode)
	s.resolvePython(ev, lp)
	st.done(StagePython)
	raw = s.enrich(ev, lp, raw)
	st.done(StageUnwind)
	s.nameNative(ev, lp)
	st.done(StageName)
	s.write(ev, raw)
	st.done(StageWrite)
	ch := s.apply(ev, lp)
	s.learn.saw(ev, ch, s.learner())
	if s.opts.Observer != nil {
		s.opts.Observer.Event(ev, ch)
	}
	if ev.API == events.ProcessExit {
		s.end(ev.PID) // its records are all read
	}
	st.done(StageLedger)
}

// track returns what the session keeps of ev's process: captured when
// first seen, and again when ev's stack points outside every mapping
// known (refresh).
func (s *session) track(ev *events.Event) *liveProc {
	l := s.lifeOf(ev.PID)
	lp := l.rec
	if lp == nil {
		lp = &liveProc{}
		l.rec = lp
		s.capture(ev.PID, lp)
		return lp
	}
	s.refresh(ev.PID, lp, ev.Stack, ev.Time)
	return lp
}

// refresh reads pid's mappings again when stack has a return address
// outside every executable mapping of its current capture: something was
// mapped since (dlopen). At most every recaptureEvery, 100 times a
// process, and never once it was found gone. The pace goes by the records'
// own timestamps (now): reading the clock for it cost a few percent of the
// reader's CPU, and a CPython process's records, each with a stray
// address, read it every time.
//
// Code without frame pointers (CPython's, NVIDIA's) leaves the
// frame-pointer walk reading data as return addresses, and those are
// outside every mapping too: a CPython process was captured anew every
// recaptureEvery, its Python layout found again and a process frame
// written each time (87 times over a 4-second loop). So the mappings are
// read and compared first, and the capture made only when the files
// mapped changed.
func (s *session) refresh(pid uint32, lp *liveProc, stack []uint64, now uint64) {
	if lp.exited || lp.recapture >= 100 || lp.covered(stack) ||
		int64(now-lp.captured) < int64(recaptureEvery<<min(lp.quiet, 3)) {
		return
	}
	if all, err := proc.ReadMaps(int(pid)); err == nil && lp.p.Current().SameFiles(all) {
		lp.captured = now
		lp.quiet++
		return
	}
	lp.quiet = 0
	lp.recapture++
	s.capture(pid, lp)
}

// covered says whether the process's current capture covers every
// address of stack. It searches the capture's mappings for each address but for the
// stacks it has the answer of: one holding the address the capture was
// last found not to cover, and the last stack it covered (an allocation
// made again from the same place; the frees between, with no stack, leave
// it). Both searched, a CPython process's 40-frame stacks took 1 µs a
// record.
func (lp *liveProc) covered(stack []uint64) bool {
	c := lp.p.Current()
	if len(stack) == 0 || c == nil { // a free's record: nothing to search, nor to remember
		return len(stack) == 0
	}
	if lp.missCap == c && slices.Contains(stack, lp.missPC) {
		return false
	}
	if lp.okCap == c && slices.Equal(stack, lp.okStack) {
		return true
	}
	pc, ok := c.Uncovered(stack)
	if ok {
		lp.missPC, lp.missCap = pc, c
		return false
	}
	lp.okStack, lp.okCap = append(lp.okStack[:0], stack...), c
	return true
}

// enrich unwinds ev's stack window, if it has one; it returns the record
// re-encoded to match. The unwinder reads the files now, while they are surely the ones
// the process mapped (a container's through /proc/PID/root while it
// lives), and the window (16 KiB or so a record: most of a trace's bytes)
// is dropped. Otherwise raw's prefix (write) is the record: BPF puts the
// Python frames right after the frames and window (events.FlagPyHead),
// unless the frames end raw's room (a record of the older layout).
func (s *session) enrich(ev *events.Event, lp *liveProc, raw []byte) []byte {
	switch {
	case s.en.Unwinds() && ev.Flags&events.FlagWindow != 0:
		s.en.Unwind(ev, lp.p.Current())
		s.refresh(ev.PID, lp, ev.Stack, ev.Time) // an unwound frame in a library mapped since
		ev.Flags &^= events.FlagWindow
		ev.Window = ev.Window[:0]
		s.buf = events.Encode(s.buf[:0], ev)
		raw = s.buf
	case ev.Flags&events.FlagPython != 0 && ev.Flags&events.FlagPyHead == 0 && events.RecordLen(ev) != len(raw):
		s.buf = events.Encode(s.buf[:0], ev)
		raw = s.buf
	}
	return raw
}

// write writes the record to the trace: only the frames the stack filled
// (an allocation record reserves room for all 127 of them), and only the
// Python frames found.
func (s *session) write(ev *events.Event, raw []byte) {
	if s.w == nil {
		return
	}
	if err := s.w.WriteEvent(raw[:events.RecordLen(ev)]); err != nil {
		s.warn(err)
	}
}

// apply hands ev to the ledger with its Python frames merged in, as
// replay does (enrich.Enricher.Apply), so that the live views' stacks are
// those report shows.
func (s *session) apply(ev *events.Event, lp *liveProc) ledger.Change {
	var py *pystack.Table
	if lp.p != nil {
		py = lp.p.Py
	}
	return s.en.Apply(s.res.Ledger, ev, py)
}

// capture reads what symbolization needs from a live process: its
// executable mappings with build IDs (procmodel.Read). It is done when the
// process is first seen, because the process may be gone by the time
// anyone reads the trace.
func (s *session) capture(pid uint32, lp *liveProc) {
	lp.captured = s.ev.Time
	l := s.lifeOf(pid)
	pending := l.pending
	l.pending = nil
	// The capture before this one, or the one a note read before its
	// first: its job and rank, read from its environment once, are kept
	// (a process about to exit may be gone by the time its environment
	// is read again).
	prev := lp.p.Current()
	if prev == nil || lp.execd {
		prev = pending // a program exec'd: its environment read anew
	}
	if prev == nil {
		prev = l.born // who it was as it started, with --all (notes.go)
	}
	lp.execd = false
	c, all := procmodel.Read(pid, s.ev.Comm, BootNow(), &s.ids, prev)
	c.Fill(pending) // a process exiting now may read part of its mappings
	l.knows(c)
	if c.Error != "" {
		lp.exited = true
		switch {
		case pending != nil && (lp.p == nil || lp.p.Current() == nil || pending.Time > lp.p.Current().Time):
			// Gone, but read at its last library load: what it mapped,
			// its interpreter found there.
			c, all = pending, pending.Maps
		case lp.p == nil:
			s.uncaptured++
		}
	}
	if c.JobError != "" && !s.warned[jobWarning] { // once: every process is the same case
		s.warned[jobWarning] = true
		s.warn(fmt.Errorf("%s, as for any other process whose environment cannot be read (said once)", c.JobError))
	}
	if c.Error == "" {
		s.uw.update(pid, all)
		// Its loader too, where no probe covers it yet: a container's
		// own (a root of its own), whose processes no note told of
		// before (with every process traced, a process that neither
		// recorded nor ran CPython makes no exec note), so that the
		// next processes of that root are told of as their loaders map
		// libraries, and get their interpreter's layout in BPF before
		// their first allocation (py_learn).
		s.attachLoaderIn(int(pid), all, false)
	}
	s.detectPython(pid, lp, c.RootDir(), all)
	lp.p = s.procs.Add(c)
	if s.opts.Observer != nil {
		s.opts.Observer.Process(c)
	}
	if s.w == nil {
		return
	}
	if err := s.w.WriteProcess(c.File()); err != nil {
		s.warn(err)
	}
}

// learner is the tracer, or nil without one (a nil *loader.Tracer in an
// interface is not nil).
func (s *session) learner() learner {
	if s.tr == nil {
		return nil
	}
	return s.tr
}

// Tick flushes the trace, snapshots counters and decides whether the
// session is over.
func (s *session) Tick() {
	s.stats.tick()
	s.gc.tick()
	s.takeOpenNote()
	s.takeRefusals()
	s.attachLate()
	s.takeNotes()
	s.learn.tick(s.learner())
	s.writeNamed(false)
	s.sweep()
	s.takeNVML()
	if (s.w != nil || s.opts.Observer != nil) && time.Since(s.lastCounters) >= counterEvery {
		s.lastCounters = time.Now()
		s.writeCounters()
	}
	if s.w != nil {
		if err := s.w.Flush(); err != nil {
			s.warn(err)
		}
	}
	if s.opts.Observer != nil {
		s.res.Events = s.events
		s.res.Maps = s.maps.uses()
		s.opts.Observer.Tick(s.res)
	}
	if s.reason != "" {
		return
	}
	if s.child != nil {
		if s.child.exited() {
			s.reason = "command exited"
			s.stop()
		}
		return
	}
	if len(s.opts.PIDs) > 0 && !slices.ContainsFunc(s.opts.PIDs, s.targetAlive) {
		s.reason = "traced processes exited"
		s.stop()
	}
}

func (s *session) writeCounters() {
	c, err := s.tr.Counters()
	if err != nil {
		s.warn(err)
		return
	}
	s.res.Counters, s.res.Lost, s.res.LostStopping = c, loader.Lost(c), s.mark.stopping(c)
	if s.w == nil {
		return
	}
	if err := s.w.WriteCounters(&tracefile.Counters{Time: BootNow(), Counters: c, Lost: s.res.Lost,
		LostStopping: s.res.LostStopping}); err != nil {
		s.warn(err)
	}
}

// finish writes the final counters and the end frame.
func (s *session) finish(res *Result) error {
	if s.w == nil {
		return nil
	}
	s.writeNamed(true)
	err := s.w.Finish(tracefile.Counters{Counters: res.Counters, Lost: res.Lost, LostStopping: res.LostStopping},
		tracefile.End{Events: s.events, Reason: res.StopReason, ExitCode: res.ExitCode, Signal: res.Signal})
	s.w = nil
	return err
}

// close releases the trace file on an error path, and the files the
// unwinder holds open on every path.
func (s *session) close() {
	s.attaching.Wait()
	if s.namer != nil {
		s.namer.stop()
	}
	s.en.Close()
	s.uw.close()
	s.uw = nil
	if s.w != nil {
		s.w.Close()
		s.w = nil
	}
}
