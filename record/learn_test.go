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
