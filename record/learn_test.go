package record

import (
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
)

type fakeLearner struct {
	on      bool
	changes int
}

func (f *fakeLearner) Learning() bool { return f.on }
func (f *fakeLearner) Learn(on bool) {
	if on != f.on {
		f.changes++
	}
	f.on = on
}

// TestLearning: the learning probes stay on while a thread that allocated
// on an unknown device has not said its device, go off once every
// allocating thread's is known (after the grace), and come back on at the
// next allocation on an unknown device.
func TestLearning(t *testing.T) {
	tr := &fakeLearner{on: true} // loader.Options.Learn: on from the start
	var l learning
	ev := func(api events.API, tid uint32, dev int32) {
		l.saw(&events.Event{PID: 7, TID: tid, API: api, Device: dev}, ledger.Change{}, tr)
	}
	l.tick(tr)
	if !tr.on {
		t.Fatal("off before any allocation")
	}
	ev(events.CuMemAlloc, 1, events.DeviceUnknown)
	ev(events.CuMemAlloc, 2, 0)
	ev(events.CuDevicePrimaryCtxRetain, 1, 1) // a retain says the retained context's device, not the thread's
	l.since = time.Now().Add(-2 * learnGrace)
	l.tick(tr)
	if !tr.on {
		t.Fatal("off while thread 1's device is unknown")
	}
	ev(events.CuCtxGetDevice, 1, 1)
	l.tick(tr)
	if !tr.on {
		t.Fatal("off right after a thread learned its device: others may be about to")
	}
	l.since = time.Now().Add(-2 * learnGrace)
	l.tick(tr)
	if tr.on {
		t.Fatal("still on once every allocating thread's device is known")
	}
	ev(events.CudaMalloc, 3, events.DeviceUnknown)
	if !tr.on || tr.changes != 2 {
		t.Fatalf("on = %v after %d changes; want on again at an allocation on an unknown device", tr.on, tr.changes)
	}
	l.tick(tr) // within the grace
	if !tr.on {
		t.Fatal("off within the grace")
	}
}

// TestLearningUntold: a thread that learned its device but not its context
// (cuCtxGetDevice) keeps the probes on while it has allocations made in
// that unnamed context: its pop may still name it (ledger's learnContext).
func TestLearningUntold(t *testing.T) {
	tr := &fakeLearner{}
	l, led := learning{}, ledger.New()
	ev := func(e *events.Event) {
		e.PID = 7
		ch := led.Apply(e)
		l.saw(e, ch, tr)
	}
	ev(&events.Event{TID: 1, API: events.CuMemAlloc, Addr: 0x1000, Size: 10, Device: events.DeviceUnknown})
	ev(&events.Event{TID: 1, API: events.CuCtxGetDevice, Device: 1, Flags: events.FlagEntryOnly})
	ev(&events.Event{TID: 1, API: events.CuMemAlloc, Addr: 0x2000, Size: 10, Device: 1})
	l.since = time.Now().Add(-2 * learnGrace)
	l.tick(tr)
	if !tr.on {
		t.Fatal("off while thread 1 has allocations in a context it has not named")
	}
	// Its pop's return names the context; the thread's device is then
	// unknown (the one below), until it says it.
	ev(&events.Event{TID: 1, API: events.CuCtxPopCurrent, Addr: 0xc0, Device: events.DeviceUnknown, Flags: events.FlagEntryOnly})
	ev(&events.Event{TID: 1, API: events.CuCtxGetCurrent, Addr: 0xd0, Size: 0xd0, Device: 0, Flags: events.FlagEntryOnly})
	l.since = time.Now().Add(-2 * learnGrace)
	l.tick(tr)
	if tr.on {
		t.Fatal("still on once thread 1's context and device are known")
	}
}

// TestLearningAgain: a thread settled (it said its device) that allocates
// on an unknown device again is pending again, though it was the last
// thread made pending before (saw skips the update for that one), and so
// is one of a process forgotten in between.
func TestLearningAgain(t *testing.T) {
	tr := &fakeLearner{on: true}
	var l learning
	ev := func(api events.API, dev int32) {
		l.saw(&events.Event{PID: 7, TID: 1, API: api, Device: dev}, ledger.Change{}, tr)
	}
	for _, settle := range []func(){
		func() { ev(events.CuCtxGetDevice, 1) },
		func() { l.forget(7) },
	} {
		ev(events.CuMemAlloc, events.DeviceUnknown)
		ev(events.CuMemAlloc, events.DeviceUnknown)
		settle()
		if len(l.pending) != 0 {
			t.Fatalf("pending %v after the thread settled", l.pending)
		}
		ev(events.CuMemAlloc, events.DeviceUnknown)
		if _, ok := l.pending[thread{7, 1}]; !ok {
			t.Fatal("a thread that allocated on an unknown device again is not pending")
		}
		ev(events.CuCtxGetDevice, 1)
	}
}
