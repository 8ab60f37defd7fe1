package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/procmodel"
)

// An OOM dump says what the node's other processes held at that moment,
// by device, and its job's other ranks' live sets by stack.
func TestOOMDumpNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour})
	rank := func(r int) *jobid.Identity {
		return &jobid.Identity{Job: "torchrun:j", Launcher: "torchrun", Rank: r, LocalRank: r, WorldSize: 2}
	}
	s.run(func() {
		s.a.Process(&procmodel.Capture{PID: 10, Comm: "r0", Job: rank(0)})
		s.a.Process(&procmodel.Capture{PID: 11, Comm: "r1", Job: rank(1)})
		s.a.Process(&procmodel.Capture{PID: 12, Comm: "other"})
	})
	s.event(events.Event{PID: 10, Comm: "r0", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Stack: []uint64{1}})
	s.event(events.Event{PID: 10, Comm: "r0", API: events.CudaMalloc, Addr: 0x20000, Size: 8192, Device: 1, Stack: []uint64{2}})
	s.event(events.Event{PID: 12, Comm: "other", API: events.CudaMalloc, Addr: 0x30000, Size: 100, Stack: []uint64{1}})
	s.event(events.Event{PID: 11, Comm: "r1", API: events.CudaMalloc, Addr: 0x40000, Size: 7, Stack: []uint64{1}})
	s.event(events.Event{PID: 11, Comm: "r1", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{3}})

	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*.json"))
	}
	if len(files) != 1 {
		t.Fatalf("dump files %v", files)
	}
	data, _ := os.ReadFile(files[0])
	var rep OOMReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	n := rep.Node
	if n == nil || len(n.Processes) != 2 {
		t.Fatalf("node: %s", data)
	}
	// Most on the failed call's device (0) first.
	if p := n.Processes[1]; p.PID != 12 || p.SameJob || p.LiveBytes != 100 || len(p.LiveStacks) != 0 {
		t.Errorf("second: %+v", p)
	}
	p := n.Processes[0]
	if p.PID != 10 || !p.SameJob || p.Rank == nil || *p.Rank != 0 || p.LiveBytes != 4096+8192 || len(p.Devices) != 2 ||
		len(p.LiveStacks) != 2 || p.LiveStacks[0].Device != 0 || p.LiveStacks[0].LiveBytes != 4096 || p.LiveStacks[1].LiveBytes != 8192 {
		t.Errorf("rank 0: %+v", p)
	}
	if len(n.Devices) != 2 || n.Devices[0].LiveBytes != 4096+100+7 || n.Devices[0].Processes != 3 || n.Devices[1].LiveBytes != 8192 {
		t.Errorf("devices %+v", n.Devices)
	}
}
