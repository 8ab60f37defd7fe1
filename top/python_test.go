package top

import (
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
)

// The selected process's top stacks show their Python lines: two lines
// under one native stack are two stacks, each with its own bytes.
func TestPythonStacks(t *testing.T) {
	c := NewCollector(time.Second, 5, nil)
	l := ledger.New()
	tb := pystack.NewTable([][2]uint64{{0x5000, 0x6000}})
	c.Python(100, tb)
	for i, line := range []int{12, 14} {
		tb.Put(pystack.Code{Code: 0xc0de, Units: int32(i), File: "/app/train.py", Function: "Model.forward", Line: line})
	}
	for i, size := range []uint64{3000, 1000} {
		ev := &events.Event{PID: 100, Comm: "python3", API: events.CudaMalloc, Addr: 0x1000 * uint64(i+1), Size: size,
			Flags: events.FlagPython, Stack: []uint64{0x10, 0x5010, 0x30},
			Py: []events.PyFrame{{Code: 0xc0de, Units: int32(i), Flags: events.PyEntry}}}
		ev.Stack, _ = tb.Stack(nil, ev)
		c.Event(ev, l.Apply(ev))
	}
	c.Tick(&record.Result{Ledger: l})
	s := c.Snapshot()
	// The table changes after the snapshot: the snapshot keeps its names.
	tb.Put(pystack.Code{Code: 0xc0de, Units: 0, File: "/elsewhere.py", Function: "changed", Line: 1})
	got := Screen(s, View{Selected: 100, Width: 200, Height: 30}, framer(nil))
	want := []string{
		"[1] 2.9 KiB live in 1 allocation",
		"    #0 0x10",
		"    #1 Model.forward (train.py:12) [python]",
		"    #2 0x30",
		"[2] 1000 B live in 1 allocation",
		"    #0 0x10",
		"    #1 Model.forward (train.py:14) [python]",
		"    #2 0x30",
	}
	text := strings.Join(got, "\n")
	if !strings.Contains(text, strings.Join(want, "\n")) {
		t.Errorf("screen\n%s\nwant the stacks\n%s", text, strings.Join(want, "\n"))
	}
}
