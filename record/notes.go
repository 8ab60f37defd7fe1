package record

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Notes are the records BPF makes for the reader rather than the ledger
// (events.OpNote): a code object captured (python.go), a traced process's
// exec, and its dynamic loader's word that it mapped libraries
// (bpf/notify.h). Each wakes the reader at once: a CUDA library a process
// loads is attached as soon as it is mapped, and its interpreter found
// before its first allocation, without stopping it. What it did before
// the reader got there is what the report says was not seen.

// noteReadsPerTick bounds, with every process on the host traced (--all,
// the agent), the reads of mappings notes ask for between two ticks (50
// ms): every process's loads reach the probe there (BPF keeps them 20 ms
// apart per process), and a node starting many Python jobs at once, each
// mapping hundreds of extension modules, must not keep the reader from
// its records. The notes over it are taken at later ticks; the periodic
// scan (latescan.go) stays behind them all. With the PID filter every
// note of a traced process is taken at once: its last one before a quick
// exit is what names its stacks (pending).
const noteReadsPerTick = 8

// note takes a note record. A process's library loads come in runs (an
// import maps hundreds of extension modules, each a note): a run of one
// process's notes, one after another in the ring buffer, is taken as one
// (openNote), when the next record is anything else or the ring buffer
// is empty for now (Idle), so that a reader behind a run catches up at
// once, not a read of the process's mappings a note.
func (s *session) note(raw []byte, ev *events.Event) {
	if ev.API == events.LibrariesMapped {
		if s.open.pid != ev.PID || !s.open.set {
			s.takeOpenNote()
			s.open = openNote{pid: ev.PID, set: true}
		}
		objs, err := events.DecodeLoaded(raw, ev, s.open.objs)
		if err != nil {
			s.warn(err)
		}
		s.open.objs, s.open.at = objs, ev.Time
		return
	}
	s.takeOpenNote()
	switch ev.API {
	case events.PyCode:
		s.pycode(raw, ev)
	case events.ProcessExec:
		s.exec(raw, ev)
	}
}

// openNote is a run of one process's library-load notes not taken yet:
// the last one's time, and the objects all of them reported.
type openNote struct {
	set  bool
	pid  uint32
	at   uint64
	objs []events.LoadedObject
}

// takeOpenNote takes the run of notes put off, if any.
func (s *session) takeOpenNote() {
	if !s.open.set {
		return
	}
	o := s.open
	s.open.set = false
	s.mapped(o.pid, o.at, o.objs)
	s.open.objs = o.objs[:0]
}

// Idle is the loader's word that the ring buffer is empty for now
// (loader.Idler).
func (s *session) Idle() { s.takeOpenNote() }

// exec takes a traced process's exec: the program it ran before is gone,
// with its interpreter and code objects (BPF dropped its layout), and
// what it runs now is captured and looked at as a process first seen.
func (s *session) exec(raw []byte, ev *events.Event) {
	pid := ev.PID
	l := s.lifeOf(pid)
	l.early, l.earlyTried, l.pending, l.born = nil, false, nil, nil // another program's, and its command line
	if s.child.is(pid) {
		s.child.execd = true
	}
	if file := events.DecodeExec(raw); file != "" {
		if testReaderPause > 0 && !s.paused && pystack.IsReadName(file) {
			// A reader behind, made on purpose: what the processes do
			// meanwhile waits in the ring buffer (vmtest
			// TestPythonFramesReaderBehind).
			s.paused = true
			time.Sleep(testReaderPause)
		}
		if !filepath.IsAbs(file) && s.child.is(pid) {
			// The launch helper's exec of the command, from the tracer's
			// own working directory.
			file, _ = filepath.Abs(file)
		}
		l.exe = file
		s.learnExecPython(pid, file)
	}
	// Who it is, from the environment BPF copied as it was born: its job
	// and rank as it started, whatever it does to that memory later and
	// however soon it exits (a rank gone before the reader read it kept no
	// job). A copy that was cut and names no job leaves it to a read.
	if env, start, whole := events.DecodeExecEnv(raw); env != nil {
		if job := jobid.FromEnv(env); job != nil || whole {
			l.born = &procmodel.Capture{PID: pid, Time: ev.Time, Exe: l.exe, Job: job,
				Start: start - start%uint64(proc.StartTimeTick)}
		}
	}
	if lp := l.rec; lp != nil {
		lp.py, lp.pyTried, lp.codes, lp.execd, lp.walked = nil, false, pystack.Captures{}, true, false
		if lp.p != nil {
			lp.p.Py = nil // a new table, should it run CPython too
		}
		s.capture(pid, lp)
	}
	s.mapped(pid, ev.Time, nil)
}

// testReaderPause (CUDATRACE_TEST_READER_PAUSE, a duration, for tests)
// holds the reader that long at the first exec note of a python3.X it
// takes: a reader as far behind as a loaded machine's, where a test wants
// it.
var testReaderPause, _ = time.ParseDuration(os.Getenv("CUDATRACE_TEST_READER_PAUSE"))

// mapped reads process pid's mappings after its loader mapped libraries
// (at boot time at; objs, the objects it reported): a CUDA library no
// probe covers is attached now, and so is its loader's notification point
// if new; a process whose interpreter is not known yet is looked at for
// one. A process gone meanwhile keeps, for its records still unread, what
// its loader reported (procmodel.WithLoaded).
func (s *session) mapped(pid uint32, at uint64, objs []events.LoadedObject) {
	if s.child.helper(pid) {
		return
	}
	l := s.lifeOf(pid)
	if s.opts.All && s.noteReads >= noteReadsPerTick {
		l.again = true
		return
	}
	s.noteReads++
	l.again = false
	prev := l.pending
	if lp := l.rec; prev == nil && lp != nil && lp.p != nil {
		prev = lp.p.Current()
	}
	if prev == nil {
		prev = l.born
	}
	c, all := procmodel.Read(pid, "", at, &s.ids, prev)
	c.Fill(l.pending) // read since its last exec (exec drops it)
	c.FillLoaded(objs, l.exe, &s.ids)
	l.knows(c)
	if c.Error != "" {
		if len(objs) > 0 {
			base := l.pending
			if base == nil {
				base = l.born // gone before any read: who it was as it was born
			}
			if base == nil && c.Start != 0 {
				// Running, its mappings not shown to this process (another
				// user's, without CAP_SYS_PTRACE): who it is as this read
				// says, the reason its job is unknown with it.
				base = c.Identity()
			}
			l.pending = procmodel.WithLoaded(base, pid, at, l.exe, objs, &s.ids)
		}
		return
	}
	// What its next allocation needs comes first: its interpreter's
	// layout in BPF, and its files' unwind rules asked for. A probe
	// attached (its loader's, a CUDA library's) takes a uprobe's
	// registration, some 16 ms here (vmtest TestPythonRenewedCode): a
	// Python program started in a root of its own allocated before its
	// layout was set when that came first.
	//
	// What it maps now, kept for its capture should it be gone by its
	// first record (or the next after a load): a process that exits
	// right after allocating still has its stacks named. With every
	// process traced (--all), only those that map CUDA, which alone make
	// records; of the others, who they are (born).
	if !s.opts.All || s.mapsCUDA(all) {
		l.pending = c
		s.uw.update(pid, all)
	} else {
		l.born = c.Identity()
	}
	lp := l.rec
	switch {
	case lp == nil:
		s.detectEarly(pid, c.RootDir(), all, false)
	case lp.py == nil && !lp.pyTried:
		s.detectPython(pid, lp, c.RootDir(), all)
	}
	s.attachMapped(pid, all, at)
}

// mapsCUDA says whether maps hold a CUDA library, or a file whose
// functions are probed (a program with the runtime linked in).
func (s *session) mapsCUDA(maps []proc.Mapping) bool {
	for _, m := range maps {
		if m.File() && (loader.IsCUDALibrary(m.Path) || s.libs.HasInode(m.Inode)) {
			return true
		}
	}
	return false
}

// takeNotes reads again the mappings of the processes whose notes came
// too soon after the last read, once a tick. Those gone end at their exit
// record, or at the sweep (life.go).
func (s *session) takeNotes() {
	s.noteReads = 0
	now := BootNow()
	for pid, l := range s.lives {
		if l.again {
			s.mapped(pid, now, nil)
		}
	}
}

// attachMapped attaches the CUDA libraries maps (process pid's) holds that
// no probe covers yet, telling when the process mapped them (at, boot ns;
// 0: not known), and the process's dynamic loader's notification point if
// it is new.
func (s *session) attachMapped(pid uint32, maps []proc.Mapping, at uint64) {
	if s.tr == nil {
		return
	}
	for _, path := range loader.CUDAPaths(int(pid), maps) {
		s.attachLib(pid, path, at)
	}
	s.attachLoaderIn(int(pid), maps, false)
}

// attachLoaderIn attaches the notification point of process pid's
// dynamic loader (maps: its mappings) if no probe covers its file yet,
// which the mapping's device and inode tell before any path is tried: the
// path a mapping shows may lead nowhere from here while its file is
// probed already (a shell that pivot_root-ed into a container's tree and
// unmounted the old one maps the host's loader under /.old-root until it
// execs), and a failed try would be said as a loader not probed. wait:
// as attachLoader.
func (s *session) attachLoaderIn(pid int, maps []proc.Mapping, wait bool) {
	if s.tr == nil {
		return
	}
	if m := loader.LoaderMapping(maps); m != nil {
		if id, ok := m.ID(); ok && s.tr.HasLoader(id) {
			s.probed.saw(id)
			return
		}
	}
	s.attachLoader(loader.LoaderIn(pid, maps), wait)
}

// attachLoader attaches the notification point of the dynamic loader at
// path (none: ""); one that cannot be is tried and said once, and its
// processes' loads are found by the periodic scan instead. With wait (as
// tracing starts, before a launched command runs) here; else on a
// goroutine of its own (s.attaching, over before the tracer closes): an
// attach waits out an RCU grace period (5-33 ms here), and a container's
// first processes, whose loader is new, make their first allocations
// while the reader would wait. A refusal comes back to the reader
// (s.refusals, said at its tick).
func (s *session) attachLoader(path string, wait bool) {
	if path == "" || s.tr == nil {
		return
	}
	if wait {
		if _, err := s.tr.AttachLoader(path); err != nil {
			s.loaderRefused(err)
		}
		return
	}
	// One the reader probed for a process (s.probed), which ends its
	// probe once no process maps it; the host's, probed as tracing
	// starts, stays.
	lib, _, err := (&loader.Libraries{}).AddLib(path)
	if err != nil { // not a regular file, or gone: said as before
		s.loaderRefused(err)
		return
	}
	id := proc.FileID{Dev: lib.Dev, Ino: lib.Inode}
	if s.probed.has(id) {
		s.probed.saw(id)
		return
	}
	if s.tr.HasLoader(id) {
		return // the host's
	}
	s.probed.add(id, true)
	tr, refusals := s.tr, s.refusals
	s.attaching.Go(func() {
		if _, err := tr.AttachLoaderFile(lib); err != nil && !errors.Is(err, loader.ErrDetached) {
			select {
			case refusals <- err:
			default: // said already, or many at once: the next is said
			}
		}
	})
}

// loaderRefused says that a loader cannot be probed (warn says each text
// once).
func (s *session) loaderRefused(err error) {
	s.warn(fmt.Errorf("%v: libraries its processes load are found by a scan of their mappings every %v instead, and their calls before it are not traced", err, s.scanEvery()))
}

// takeRefusals says the refusals of loaders attached off the reader's
// goroutine.
func (s *session) takeRefusals() {
	for {
		select {
		case err := <-s.refusals:
			s.loaderRefused(err)
		default:
			return
		}
	}
}

// attachLib attaches a CUDA library file process pid mapped after tracing
// began, once per file (inode); loaded is when the process mapped it (boot
// ns; 0: not known, found by the scan). It runs on the reader goroutine,
// which owns the tracer, the ledger and the trace.
func (s *session) attachLib(pid uint32, path string, loaded uint64) {
	lib, isNew, err := s.libs.AddLib(path)
	if err != nil {
		return
	}
	id := proc.FileID{Dev: lib.Dev, Ino: lib.Inode}
	if !isNew {
		s.probed.saw(id)
		return
	}
	ar, err := s.tr.Attach(lib)
	if errors.Is(err, loader.ErrDetached) {
		return // tracing is ending: the rest of the ring is being read
	}
	if err != nil {
		s.warn(fmt.Errorf("pid %d loaded %s after tracing began, and it cannot be traced: %w", pid, path, err))
		return
	}
	s.probed.add(id, false)
	now := BootNow()
	var before uint64
	if p := s.res.Ledger.Process(pid); p != nil {
		before = p.Allocs + p.Failed + p.Frees + p.UnknownFrees
	}
	s.writeAttach(ar, &tracefile.Attach{Time: now, PID: pid, EventsBefore: before, Loaded: loaded})
	if loaded != 0 && now > loaded {
		fmt.Fprintf(s.opts.Stderr, "cudatrace: pid %d loaded %s after tracing began: attached %d probes %v after it mapped it; calls it made into it in between, if any, were not traced\n",
			pid, path, ar.Programs, time.Duration(now-loaded).Round(10*time.Microsecond))
		return
	}
	fmt.Fprintf(s.opts.Stderr, "cudatrace: pid %d loaded %s after tracing began, found by the scan of its mappings: attached %d probes now; its calls before this were not traced, and how many there were cannot be known\n",
		pid, path, ar.Programs)
}

// scanEvery is how often the periodic scan looks at the traced processes'
// mappings.
func (s *session) scanEvery() time.Duration {
	if s.opts.All {
		return lateScanAllEvery
	}
	return lateScanEvery
}

// attachLoaders captures, as tracing starts, each --pid process once:
// kept (pending) for its first record, which a process that exits first
// then still finds, named as it was running before the trace and with
// its stacks' mappings; its mappings looked at for its interpreter
// (detectEarly) and its dynamic loader's notification point, which it
// attaches. Then it attaches the system's loader (a launched command's,
// most of the host's processes').
func (s *session) attachLoaders(pids []int) {
	for _, pid := range pids {
		c, maps := procmodel.Read(uint32(pid), "", BootNow(), &s.ids, nil)
		if c.Error != "" {
			continue // gone: its first record, if any, says so
		}
		l := s.lifeOf(uint32(pid))
		l.knows(c)
		l.pending = c
		s.uw.update(uint32(pid), maps)
		s.detectEarly(uint32(pid), c.RootDir(), maps, true)
		s.attachLoaderIn(pid, maps, true)
	}
	if len(s.opts.Command) == 0 && !s.opts.All {
		return
	}
	s.attachLoader(loader.SystemLoader(), true)
	// Our own, which a dynamically linked cudatrace shares with the host.
	if maps, err := proc.ReadMaps(os.Getpid()); err == nil {
		s.attachLoaderIn(os.Getpid(), maps, true)
	}
}
