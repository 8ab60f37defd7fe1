package record

import (
	"sync/atomic"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
)

// A process's life in a session, in one place. A process is born once: the
// first record or note of it, or the attach of --pid (lifeOf). It is known
// by its PID and its start time (life.start, from its first read), which a
// later process given the PID does not share. It ends once (end): at its
// exit record, which BPF makes when its last thread exits, after every
// other record of it, having dropped the process from every BPF map keyed
// by process or thread (bpf/exit.h); or, for what that missed (an exit
// record lost to a full ring buffer, a process BPF had no room to note),
// at the sweep, which finds it gone or its PID another process's. Every
// per-process structure of the session is a field of its life, or is ended
// by end: nothing else deletes a process's state.

// sweepEvery is how often the sweep looks for processes gone unseen.
const sweepEvery = 5 * time.Second

// sweepBPFEvery is how often the sweep also walks the BPF maps keyed by
// process for entries of processes gone (loader.Tracer.Sweep): the
// reader's late writes (a layout or filter entry for a process that had
// just ended).
const sweepBPFEvery = 30 * time.Second

// life is what the session keeps of one process between its birth and its
// end.
type life struct {
	// start is the process's start time (proc.StartTime's boot ns), from
	// the first read of it; 0 until then.
	start uint64
	// rec is its records' state, from its first record (track); nil for
	// a process only heard of through notes.
	rec *liveProc
	// early is the interpreter found in it before its first record
	// (detectEarly), for that record's capture; earlyTried with a nil
	// early: looked for, with an error said once.
	early      *pystack.Interp
	earlyTried bool
	// pending is its capture as a note (or the attach) last read it, for
	// its next record should it be gone by then (notes.go); exe, the
	// file it last exec'd.
	pending *procmodel.Capture
	exe     string
	// born: who it was (procmodel.Capture.Identity) at its first note
	// since its exec, with every process traced (--all), where it mapped
	// no CUDA then and its capture was not kept: the command line, job
	// and rank it started with, which a later read keeps should it
	// rename itself (setproctitle) before its first CUDA call.
	born *procmodel.Capture
	// again: a note came that was not taken (over noteReadsPerTick):
	// its mappings are read at the next tick.
	again bool
	// layout: the reader gave BPF its CPython layout (py_procs), which
	// its end deletes again should the write have come after BPF's
	// own delete at its exit.
	layout bool
	// gone: boot ns when the sweep first found it gone, unseen by an
	// exit record: ended at a later sweep, pendingAfterExit on, after its
	// records still in the ring buffer.
	gone uint64
}

// pendingAfterExit is how long a process found gone by the sweep is kept,
// for records of it still unread.
const pendingAfterExit = 5 * time.Second

// lifeOf returns pid's life, born now if the session knew nothing of it.
func (s *session) lifeOf(pid uint32) *life {
	// The last one asked for first: a record's process is most often the
	// last record's (a map look-up a record, and two for an allocation
	// whose stack is checked after unwinding, otherwise). end forgets it.
	if l := s.lastLife; l != nil && s.lastPID == pid {
		return l
	}
	l := s.lives[pid]
	if l == nil {
		l = &life{}
		s.lives[pid] = l
	}
	s.lastPID, s.lastLife = pid, l
	return l
}

// knows sets l's start time from a read of its process, if it had none.
func (l *life) knows(c *procmodel.Capture) {
	if l.start == 0 && c != nil && c.Error == "" {
		l.start = c.Start
	}
}

// end ends pid's life, the one way: its state in the session, in the
// tracer's learning and in BPF goes (BPF has dropped what it keeps itself
// at the exit; Forget covers a layout the reader wrote after it, and is
// not paid for the host's every other process). With every
// process traced (--all, the agent) its model goes too: a node's state
// stays bounded by its living processes. The other sessions follow a few
// processes and keep their models to the end of the recording.
func (s *session) end(pid uint32) {
	l, ok := s.lives[pid]
	if !ok {
		return
	}
	delete(s.lives, pid)
	if s.lastPID == pid {
		s.lastLife = nil
	}
	s.learn.forget(pid)
	s.uw.forget(pid)
	if s.tr != nil && (l.layout || s.uw != nil) {
		s.tr.Forget(pid)
	}
	if s.opts.All {
		s.procs.Forget(pid)
		s.en.Forget(pid)
	}
}

// sweep ends the lives of the processes gone without an exit record, and
// every sweepBPFEvery, the BPF maps' entries of processes gone. A process
// whose PID another process has now (its start time differs) is gone too.
// One that made records is ended through the ledger as its exit record
// would have (what it held is held at exit, released), in the trace and
// for the observers, and counted (Result.ExitsSwept).
func (s *session) sweep() {
	if time.Since(s.lastSweep) < sweepEvery {
		return
	}
	s.lastSweep = time.Now()
	now := BootNow()
	for pid, l := range s.lives {
		if proc.Running(int(pid), l.start) {
			l.gone = 0
			continue
		}
		if l.gone == 0 {
			l.gone = now
			continue
		}
		if now-l.gone < uint64(pendingAfterExit) {
			continue
		}
		if l.rec != nil {
			s.exitUnseen(pid, now)
		}
		s.end(pid)
	}
	if s.tr != nil && time.Since(s.lastBPFSweep) >= sweepBPFEvery {
		s.lastBPFSweep = time.Now()
		s.pyFiles.sweep()
		s.sweepProbed()
		s.res.ExitsSwept += uint64(s.tr.Sweep(func(pid uint32) bool {
			return s.lives[pid] != nil || proc.Alive(int(pid))
		}))
	}
}

// exitUnseen ends, through the ledger, the trace and the observers, a
// process that made records and is gone without its exit record.
func (s *session) exitUnseen(pid uint32, now uint64) {
	p := s.res.Ledger.Process(pid)
	if p == nil || p.Exited {
		return
	}
	s.res.ExitsSwept++
	ev := events.Event{Time: now, PID: pid, TID: pid, Comm: p.Comm, API: events.ProcessExit,
		Device: events.DeviceUnknown, Flags: events.FlagEntryOnly}
	s.buf = events.Encode(s.buf[:0], &ev)
	s.write(&ev, s.buf)
	ch := s.res.Ledger.Apply(&ev)
	if s.opts.Observer != nil {
		s.opts.Observer.Event(&ev, ch)
	}
}

// MapUse is how full one BPF map keyed by process, thread or file is
// (loader.MapUse), for the live views.
type MapUse = loader.MapUse

// mapCountEvery is how often the BPF maps' entries are counted.
const mapCountEvery = 5 * time.Second

// mapCounter counts the entries of the BPF maps keyed by process, thread
// or file on a goroutine of its own (a walk of a full map takes tens of
// milliseconds, which the ring buffer's reader must not wait): the latest
// counts are Result.Maps, so that a node can see that they stay bounded
// by what is alive.
type mapCounter struct {
	latest atomic.Pointer[[]MapUse]
	stop   chan struct{}
	done   chan struct{}
}

func startMapCounter(tr *loader.Tracer, every time.Duration) *mapCounter {
	mc := &mapCounter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(mc.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if uses, err := tr.MapUses(); err == nil {
				mc.latest.Store(&uses)
			}
			select {
			case <-mc.stop:
				return
			case <-t.C:
			}
		}
	}()
	return mc
}

// uses is the latest count (nil before the first, or without a counter).
func (mc *mapCounter) uses() []MapUse {
	if mc == nil {
		return nil
	}
	if p := mc.latest.Load(); p != nil {
		return *p
	}
	return nil
}

func (mc *mapCounter) close() {
	if mc != nil {
		close(mc.stop)
		<-mc.done
	}
}

// sweepProbed ends the probes of the files probed for processes that no
// process maps any more (probed.go), off the reader's goroutine; the late
// scan then reports the CUDA libraries it saw again, should one be mapped
// anew.
func (s *session) sweepProbed() {
	forget := func(id proc.FileID, isLoader bool) {
		if isLoader {
			s.attaching.Go(s.tr.ForgetLoader(id))
			return
		}
		s.libs.Remove(id.Dev, id.Ino)
		s.attaching.Go(s.tr.ForgetLibrary(id))
	}
	known := func(pid int) bool { return s.lives[uint32(pid)] != nil }
	if s.probed.sweep(forget, known, &s.attaching) {
		s.scanner.reset()
	}
}
