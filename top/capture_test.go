package top

import (
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/symbolize"
)

// A stack is named from the mappings its process had when the stack was
// first seen, as report does, not from the latest: an exec or a dlopen
// after it maps other files at the same addresses.
func TestStackNamedFromItsCapture(t *testing.T) {
	c := NewCollector(time.Second, 5, nil)
	collector = c
	l := events.NewLedger()
	maps := func(path string) []proc.Mapping {
		return []proc.Mapping{{Start: 0x1000, End: 0x2000, Perms: "r-xp", Inode: 1, Path: path}}
	}
	c.Process(&procmodel.Capture{PID: 100, Comm: "train", Maps: maps("/before/exec")})
	alloc(l, 100, "train", 0x10000, 200, 0, events.CudaMalloc, 0x1100)
	c.Process(&procmodel.Capture{PID: 100, Comm: "train", Maps: maps("/after/exec")})
	alloc(l, 100, "train", 0x20000, 100, 0, events.CudaMalloc, 0x1200)
	// A capture that failed (the process exited first) says nothing of
	// the mappings: the next stack is read against the last ones read.
	c.Process(&procmodel.Capture{PID: 100, Comm: "train", Error: "exited before its mappings could be read"})
	alloc(l, 100, "train", 0x30000, 50, 0, events.CudaMalloc, 0x1300)
	c.Tick(&record.Result{Ledger: l})
	s := c.Snapshot()
	if s == nil || len(s.Stacks) != 3 {
		t.Fatalf("snapshot %+v, want 3 stacks", s)
	}
	sym := symbolize.New()
	defer sym.Close()
	frames := framer(sym)
	want := map[uint64]string{200: "/before/exec", 100: "/after/exec", 50: "/after/exec"}
	for i := range s.Stacks {
		st := &s.Stacks[i]
		f := frames(st)
		if len(f) != 1 || f[0].Module != want[st.Live] || f[0].Addr != st.Frames[0] {
			t.Errorf("stack of %d live bytes named %+v, want module %s", st.Live, f, want[st.Live])
		}
	}
}
