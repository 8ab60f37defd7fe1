package record

import (
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
)

// TestReaderStats: with Options.ReaderStats every record is counted and
// timed, stage by stage, and the line record -v prints names each stage.
func TestReaderStats(t *testing.T) {
	s := newState(Options{ReaderStats: true}, &Result{Ledger: ledger.New()})
	defer s.close()
	const pid = 1 << 30 // no such process: its capture fails, as a gone process's does
	for i := range 3 {
		ev := events.Event{PID: pid, TID: pid, API: events.CudaMalloc, Addr: 0x1000 * uint64(i+1), Size: 4096, Stack: []uint64{0x401000}}
		s.Record(events.Encode(nil, &ev))
	}
	s.stats.tick()
	st := s.stats
	if st.Events != 3 || s.events != 3 {
		t.Fatalf("counted %d events (session %d), want 3", st.Events, s.events)
	}
	if p := s.res.Ledger.Process(pid); p == nil || p.Allocs != 3 {
		t.Fatalf("the ledger did not get the 3 allocations: %+v", p)
	}
	var staged int64
	for _, d := range st.Stages {
		staged += int64(d)
	}
	if staged <= 0 {
		t.Fatalf("no time in any stage: %v", st.Stages)
	}
	var b strings.Builder
	st.Write(&b)
	for _, want := range []string{"reader: 3 events", "ns of process CPU per event", "decode ", "unwind ", "ledger ", "write ", "python ", "name "} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("%q lacks %q", b.String(), want)
		}
	}
}
