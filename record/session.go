package record

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cudatrace/cudatrace/container"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
	"github.com/cudatrace/cudatrace/unwind"
)

// counterEvery is how often a counters snapshot goes to the trace, so a
// killed tracer's file still says what was lost up to then.
const counterEvery = time.Second

// pruneEvery is how often a session of every process (--all, the agent)
// forgets the processes that are gone: on a host where processes come and
// go for good, its state must stay bounded by the living ones.
const pruneEvery = 5 * time.Second

// recaptureEvery rate-limits re-reading a process's maps when its stacks
// point outside every mapping we know (a library dlopen'ed late).
const recaptureEvery = 200 * time.Millisecond

// session is the loader's Handler for one recording: it decodes records,
// feeds the ledger and writes the trace.
type session struct {
	opts   Options
	res    *Result
	tr     *loader.Tracer
	w      *tracefile.Writer // nil without -o
	ev     events.Event
	events uint64

	procs    map[uint32]*procState
	buildIDs map[fileKey]string

	// uw unwinds the records' stack windows as they come, unless
	// Options.KeepStackWindows leaves that to replay; buf holds a record
	// re-encoded without its window.
	uw  *unwind.Unwinder
	pcs []uint64
	buf []byte
	cut uint64 // stacks that ended with the window
	// merged holds the stack the ledger gets, Python frames merged in
	// (python.go apply).
	merged []uint64

	child  *child
	stop   func()
	reason string

	lastCounters time.Time
	scanner      *scanner // finds libraries loaded late
	lastPrune    time.Time
	libs         loader.Libraries // every library attached, by inode
	warned       map[string]bool
	sampler      *sampler // nil without Options.NVML
	namer        *namer   // names container processes' frames; nil until one is seen
	// pyAtStart: the --pid processes' interpreters, found when tracing
	// started (nil: none), until their first record (detectPython).
	pyAtStart map[uint32]*pystack.Interp
}

type procState struct {
	start     uint64      // the process's start time: a PID reused has another
	exec      [][2]uint64 // executable ranges of the last capture
	umaps     *unwind.Maps
	captured  time.Time
	exited    bool
	recapture int
	py        *pyProc // nil: no CPython found (yet)
	pyTried   bool
	// root is what its mappings' paths are opened under: "" when it
	// sees the tracer's files, /proc/PID/root when it has its own (a
	// container).
	root string
	maps []proc.Mapping // executable file mappings of the last capture, with build IDs
}

type fileKey struct {
	path, dev string
	inode     uint64
}

func newSession(opts Options, res *Result, tr *loader.Tracer) (*session, error) {
	s := &session{
		opts: opts, res: res, tr: tr,
		procs:    make(map[uint32]*procState),
		buildIDs: make(map[fileKey]string),
		warned:   make(map[string]bool),
	}
	if !opts.KeepStackWindows {
		s.uw = unwind.New()
	}
	if opts.Output == "" {
		return s, nil
	}
	host, _ := os.Hostname()
	var uts syscall.Utsname
	var kernel string
	if syscall.Uname(&uts) == nil {
		kernel = cString(uts.Release[:])
	}
	meta := tracefile.Meta{
		Tool:      "cudatrace " + opts.Version,
		Host:      host,
		Kernel:    kernel,
		StartBoot: bootNow(),
		StartWall: time.Now(),
		Command:   opts.Command,
		PIDs:      opts.PIDs,
		All:       opts.All,
	}
	w, err := tracefile.Create(opts.Output, meta)
	if err != nil {
		return nil, err
	}
	s.w = w
	return s, nil
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
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
		a.Time, a.PID, a.EventsBefore = late.Time, late.PID, late.EventsBefore
	}
	if err := s.w.WriteAttach(a); err != nil {
		s.warn(err)
	}
}

// prune forgets the processes that have exited, with --all only: the
// other sessions follow a few processes and end with them. Their events
// were read long before (the ring buffer is drained every poll). A PID
// that another process has taken since is forgotten too: the next event
// captures the new process.
func (s *session) prune() {
	if !s.opts.All || time.Since(s.lastPrune) < pruneEvery {
		return
	}
	s.lastPrune = time.Now()
	for pid, ps := range s.procs {
		st, err := proc.StartTime(int(pid))
		if err != nil || !proc.Alive(int(pid)) || ps.start != 0 && st != ps.start {
			if ps.py != nil && s.tr != nil {
				s.tr.ForgetPython(pid)
			}
			delete(s.procs, pid)
		}
	}
}

// Record handles one ring-buffer record.
func (s *session) Record(raw []byte) {
	if err := events.Decode(raw, &s.ev); err != nil {
		s.warn(err)
		return
	}
	s.events++
	ev := &s.ev
	ps := s.procs[ev.PID]
	if ps == nil {
		ps = &procState{}
		s.procs[ev.PID] = ps
		s.capture(ev.PID, ps)
	} else if !ps.exited && !ps.covers(ev.Stack) && time.Since(ps.captured) >= recaptureEvery && ps.recapture < 100 {
		// A return address outside every executable mapping we know:
		// something was mapped since the capture (dlopen).
		ps.recapture++
		s.capture(ev.PID, ps)
	}
	if ev.Flags&events.FlagHeld != 0 {
		// BPF stopped the process at this record for the capture above
		// (or for one made earlier, if BPF forgot the process): let it go.
		if err := syscall.Kill(int(ev.PID), syscall.SIGCONT); err != nil && err != syscall.ESRCH {
			s.warn(fmt.Errorf("resume pid %d after reading its mappings: %w", ev.PID, err))
		}
		s.tr.Resumed(ev.PID)
	}
	if s.uw != nil && ev.Flags&events.FlagWindow != 0 {
		raw = s.unwind(ev, ps)
	} else if ev.Flags&events.FlagPython != 0 {
		// BPF leaves the Python frames at the end of the room reserved:
		// RecordLen's prefix would cut them off.
		s.buf = events.Encode(s.buf[:0], ev)
		raw = s.buf
	}
	s.resolvePython(ev, ps)
	s.nameNative(ev, ps)
	if s.w != nil {
		// Only the frames the stack filled: an allocation record reserves
		// room for all 127 of them.
		if err := s.w.WriteEvent(raw[:events.RecordLen(ev)]); err != nil {
			s.warn(err)
		}
	}
	ch := s.apply(ev, ps)
	if s.opts.Observer != nil {
		s.opts.Observer.Event(ev, ch)
	}
}

// unwind replaces ev's frame-pointer stack with the deeper of it and the
// stack unwound from its window, drops the window (16 KiB or so a record:
// most of a trace's bytes) and returns the record re-encoded to match.
// The files are read now, while they are surely the ones the process
// mapped; a container's through /proc/PID/root while it lives.
func (s *session) unwind(ev *events.Event, ps *procState) []byte {
	if ps.umaps != nil {
		var stop unwind.Stop
		s.pcs, stop = s.uw.Unwind(ps.umaps, ev.Regs, ev.Window, ev.Flags&events.FlagEntryOnly == 0, s.pcs[:0])
		merged := unwind.Merge(ev.Stack, s.pcs, stop)
		if stop.Kind == unwind.StopWindow && len(merged) == len(s.pcs) {
			s.cut++
		}
		ev.Stack = append(ev.Stack[:0], merged...)
		if !ps.exited && !ps.covers(ev.Stack) && time.Since(ps.captured) >= recaptureEvery && ps.recapture < 100 {
			ps.recapture++ // an unwound frame in a library mapped since
			s.capture(ev.PID, ps)
		}
	}
	ev.Flags &^= events.FlagWindow
	ev.Window = ev.Window[:0]
	s.buf = events.Encode(s.buf[:0], ev)
	return s.buf
}

func (ps *procState) covers(stack []uint64) bool {
	for _, pc := range stack {
		in := false
		for _, r := range ps.exec {
			if pc >= r[0] && pc < r[1] {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	return true
}

// capture reads what symbolization needs from a live process: its
// executable mappings with build IDs. It is done when the process is first
// seen, because the process may be gone by the time anyone reads the trace.
func (s *session) capture(pid uint32, ps *procState) {
	ps.captured = time.Now()
	p := &tracefile.Process{PID: pid, Time: bootNow(), Comm: s.ev.Comm}
	maps, err := proc.ReadMaps(int(pid))
	if err != nil {
		ps.exited = true
		p.Error = fmt.Sprintf("exited before its mappings could be read (%v): its stacks are not symbolized", err)
	}
	// A container's paths name its own files: the host's file at the same
	// path is another build, with other CFI and symbols. /proc/PID/root
	// reads "/" after pivot_root: the mount namespace tells.
	p.OwnRoot, _ = proc.OwnRoot(int(pid))
	ps.root = ""
	if p.OwnRoot {
		ps.root = proc.RootPath(int(pid), "/")
	}
	s.detectPython(pid, ps, maps)
	ps.exec = ps.exec[:0]
	for _, m := range maps {
		if !m.Exec() || !m.File() {
			continue
		}
		ps.exec = append(ps.exec, [2]uint64{m.Start, m.End})
		m.BuildID = s.buildID(int(pid), m)
		p.Maps = append(p.Maps, m)
	}
	if len(p.Maps) > 0 {
		ps.maps = p.Maps
	}
	if s.uw != nil && len(p.Maps) > 0 {
		open := p.Maps
		if p.OwnRoot {
			open = slices.Clone(p.Maps)
			for i := range open {
				open[i].Path = proc.RootPath(int(pid), open[i].Path)
			}
		}
		ps.umaps = unwind.NewMaps(open)
	}
	if c, err := proc.Comm(int(pid)); err == nil {
		p.Comm = c
	}
	p.Cmdline, _ = proc.Cmdline(int(pid))
	p.PPID, _ = proc.PPID(int(pid))
	if st, err := proc.StartTime(int(pid)); err == nil {
		p.Start, ps.start = st, st
	}
	p.Exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if in, err := container.Of(int(pid)); err == nil {
		p.Container, p.Pod = in.ID, in.PodUID
	}
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err == nil && root != "/" {
		p.Root = root
	}
	if s.opts.Observer != nil {
		s.opts.Observer.Process(p)
	}
	if s.w == nil {
		return
	}
	if err := s.w.WriteProcess(p); err != nil {
		s.warn(err)
	}
}

func (s *session) buildID(pid int, m proc.Mapping) string {
	// The device too: a container's file system numbers its inodes on
	// its own.
	k := fileKey{m.Path, m.Dev, m.Inode}
	if id, ok := s.buildIDs[k]; ok {
		return id
	}
	id, _ := symbolize.BuildID(proc.RootPath(pid, m.Path))
	s.buildIDs[k] = id
	return id
}

// Tick flushes the trace, snapshots counters and decides whether the
// session is over.
func (s *session) Tick() {
	s.attachLate()
	s.writeNamed(false)
	s.prune()
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
	if len(s.opts.PIDs) > 0 && !slices.ContainsFunc(s.opts.PIDs, proc.Alive) {
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
	s.res.Counters, s.res.Lost = c, loader.Lost(c)
	if s.w == nil {
		return
	}
	if err := s.w.WriteCounters(&tracefile.Counters{Time: bootNow(), Counters: c, Lost: loader.Lost(c)}); err != nil {
		s.warn(err)
	}
}

// finish writes the final counters and the end frame.
func (s *session) finish(res *Result) error {
	if s.w == nil {
		return nil
	}
	s.writeNamed(true)
	if err := s.w.WriteCounters(&tracefile.Counters{Time: bootNow(), Counters: res.Counters, Lost: res.Lost}); err != nil {
		return err
	}
	if err := s.w.WriteEnd(&tracefile.End{Time: bootNow(), Events: s.events, Reason: res.StopReason,
		ExitCode: res.ExitCode, Signal: res.Signal}); err != nil {
		return err
	}
	err := s.w.Close()
	s.w = nil
	return err
}

// close releases the trace file on an error path, and the files the
// unwinder holds open on every path.
func (s *session) close() {
	if s.namer != nil {
		s.namer.stop()
	}
	if s.uw != nil {
		s.uw.Close()
	}
	if s.w != nil {
		s.w.Close()
		s.w = nil
	}
}
