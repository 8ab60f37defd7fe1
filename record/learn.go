package record

import (
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
)

// learner is the tracer's side of it (loader.Tracer).
type learner interface {
	Learning() bool
	Learn(on bool)
}

// learnGrace is how long the learning probes stay on at least, once on:
// threads that allocate right after the attach learn their devices too.
const learnGrace = 2 * time.Second

// learning decides when the tracer's learning probes (loader.LearnProbes)
// are on. A thread that ran before tracing began allocates on a device
// cudatrace did not see chosen (events.DeviceUnknown), in a context it did
// not see made current, until its own calls say which; the probes that
// hear them cost a trap per call, so they are on only until every thread
// seen allocating has a known device and has named the context of what it
// allocated (ledger.Allocation.Untold): off once none is pending, an allocation has been seen, and learnGrace has passed
// since they went on and since the last thing they taught; on again at
// the next allocation on an unknown device. What was allocated before
// stays on the unknown device: never guessed.
type learning struct {
	pending map[thread]struct{} // threads that allocated on an unknown device or in an unnamed context, not known since
	since   time.Time           // when the probes went on or last taught something (zero: not yet seen on)
	allocs  bool                // an allocation was seen since they went on
	// last is the thread last made pending, while it still is
	// (lastSet): its next allocations, one after another, skip the map
	// update.
	last    thread
	lastSet bool
}

type thread struct{ pid, tid uint32 }

// saw follows one event and what the ledger made of it (ch): an
// allocation on an unknown device or in an unnamed context makes its
// thread pending (and turns the probes on), a record saying its device
// (a context call), once the thread has no untold allocation left,
// settles it.
func (l *learning) saw(ev *events.Event, ch ledger.Change, tr learner) {
	if tr == nil {
		return
	}
	switch ev.API.Info().Op {
	case events.OpAlloc:
		l.allocs = true
		if ev.Device != events.DeviceUnknown && (ch.Alloc == nil || !ch.Alloc.Untold()) {
			return
		}
		if t := (thread{ev.PID, ev.TID}); !l.lastSet || l.last != t {
			if l.pending == nil {
				l.pending = make(map[thread]struct{})
			}
			l.pending[t] = struct{}{}
			l.last, l.lastSet = t, true
		}
		if !tr.Learning() {
			tr.Learn(true)
			l.since = time.Now()
		}
	case events.OpContext:
		switch ev.API {
		case events.CuCtxGetCurrent, events.CuCtxGetDevice, events.CudaGetDevice, events.CuCtxPopCurrent:
			l.since = time.Now() // a thread is learning: others may be about to
		}
		// Every context record but a retain's says the thread's device
		// after it (a retain's, the retained context's).
		if ev.Device != events.DeviceUnknown && ev.API != events.CuDevicePrimaryCtxRetain &&
			(ch.Process == nil || !ch.Process.Untold(ev.TID)) {
			delete(l.pending, thread{ev.PID, ev.TID})
			l.lastSet = false
		}
	}
}

// forget drops the threads of a process that ended (life.go end).
func (l *learning) forget(pid uint32) {
	l.lastSet = false
	for t := range l.pending {
		if t.pid == pid {
			delete(l.pending, t)
		}
	}
}

// tick turns the probes off once nothing is left to learn.
func (l *learning) tick(tr learner) {
	if tr == nil || !tr.Learning() {
		return
	}
	if l.since.IsZero() {
		l.since = time.Now() // on from the start (loader.Options.Learn)
	}
	if len(l.pending) == 0 && l.allocs && time.Since(l.since) >= learnGrace {
		tr.Learn(false)
		l.since, l.allocs = time.Time{}, false
	}
}
