package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

// ends lists the End of each item.
func ends(h []export.HistoryItem) []uint64 {
	out := make([]uint64, len(h))
	for i := range h {
		out[i] = h[i].End
	}
	return out
}

// consecutive says whether h's items are from..to-1, in order.
func consecutive(h []export.HistoryItem, from, to uint64) bool {
	if uint64(len(h)) != to-from {
		return false
	}
	for i := range h {
		if h[i].End != from+uint64(i) {
			return false
		}
	}
	return true
}

func TestRecorderKeepsTheLatest(t *testing.T) {
	r := newRecorder(1000, 1<<30)
	for i := range uint64(2500) {
		r.add(7, export.HistoryItem{End: i})
	}
	if h := r.list(7); !consecutive(h, 1500, 2500) {
		t.Fatalf("history %v, want 1500..2499", ends(h))
	}
	if r.used != 1000 || r.events() != 1000 || r.bytes() != int64(1000*historyItemCost) {
		t.Errorf("used %d slots, %d events, %d bytes; want 1000 of each, %d bytes", r.used, r.events(), r.bytes(), 1000*historyItemCost)
	}
	r.forget(7)
	if r.used != 0 || r.list(7) != nil {
		t.Errorf("after forget: %d slots used, history %v", r.used, r.list(7))
	}
	off := newRecorder(0, 1<<30)
	off.add(1, export.HistoryItem{})
	if off.list(1) != nil || off.used != 0 {
		t.Errorf("0 events per process keeps %v", off.list(1))
	}
}

// TestRecorderBudget: ten processes over a budget of 3000 slots, one of
// them far busier: the slots never pass the budget, each ring holds its
// process's latest events in order, and the busy one does not starve the
// others.
func TestRecorderBudget(t *testing.T) {
	r := newRecorder(100000, int64(3000*historyItemCost))
	if r.max != 3000 || r.perProc != 3000 {
		t.Fatalf("max %d per process %d, want 3000 and 3000", r.max, r.perProc)
	}
	next := map[uint32]uint64{}
	add := func(pid uint32) {
		r.add(pid, export.HistoryItem{End: next[pid]})
		next[pid]++
		if r.used > r.max {
			t.Fatalf("%d slots used, over the budget's %d", r.used, r.max)
		}
	}
	for range 20000 {
		add(1) // the busy one starts first and takes what it can
	}
	for round := range 20000 {
		for pid := uint32(2); pid <= 10; pid++ {
			add(pid)
		}
		if round%4 == 0 {
			add(1)
		}
	}
	for pid := uint32(1); pid <= 10; pid++ {
		h := r.list(pid)
		if len(h) < 3000/10/2 {
			t.Errorf("pid %d keeps %d events: starved", pid, len(h))
		}
		if !consecutive(h, next[pid]-uint64(len(h)), next[pid]) {
			t.Errorf("pid %d: history %v is not its latest %d events in order", pid, ends(h), len(h))
		}
	}
	for pid := uint32(2); pid <= 10; pid++ {
		r.forget(pid)
	}
	for range 10000 {
		add(1)
	}
	if h := r.list(1); len(h) != 3000 || !consecutive(h, next[1]-3000, next[1]) {
		t.Errorf("alone again, pid 1 keeps %d events, want its latest 3000", len(h))
	}
}

// TestOOMDumpHistory: the OOM black box and /snapshot carry the process's
// latest HistoryEvents events as memory_viz's trace entries, exactly,
// undoable from the snapshot (memviztest), across devices, with a segment
// allocated before the history began and freed inside it.
func TestOOMDumpHistory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour, HistoryEvents: 100})
	pid := uint32(os.Getpid())
	s.process(pid, "job")
	ev := func(api events.API, addr, size uint64, dev int32, result int32) {
		s.event(events.Event{PID: pid, Comm: "job", API: api, Addr: addr, Size: size, Device: dev, Result: result,
			Stack: []uint64{uint64(api) + 1}})
	}
	ev(events.CudaMalloc, 0x100000, 4096, 0, 0) // older than the history
	const pairs = 500
	for range pairs {
		ev(events.CudaMalloc, 0x200000, 1024, 0, 0)
		ev(events.CudaFree, 0x200000, 0, 0, 0)
	}
	ev(events.CudaFree, 0x100000, 0, 0, 0)
	ev(events.CudaMalloc, 0x300000, 2048, 1, 0)
	ev(events.CudaMalloc, 0, 1<<40, 0, 2) // out of memory on device 0

	// The latest 100 events: 97 of the churn (a free first), the free of
	// the older segment, the allocation on device 1, the failure.
	var want0 []string
	free := func(addr, size uint64) {
		for _, a := range []string{"free_requested", "free_completed", "segment_free"} {
			want0 = append(want0, fmt.Sprintf("%s %#x %d", a, addr, size))
		}
	}
	free(0x200000, 1024)
	for range 48 {
		want0 = append(want0, "segment_alloc 0x200000 1024", "alloc 0x200000 1024")
		free(0x200000, 1024)
	}
	free(0x100000, 4096)
	want0 = append(want0, "oom 0x0 1099511627776")
	want1 := []string{"segment_alloc 0x300000 2048", "alloc 0x300000 2048"}

	check := func(what, path string) {
		t.Helper()
		memviztest.Check(t, path, memviztest.Want{})
		py := testenv.Python3(t, "pickle", "json")
		out := testenv.RunPython(t, py, `import json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
print(json.dumps([["%s %#x %d" % (e["action"], e.get("addr", 0), e["size"]) for e in tr] for tr in d["device_traces"]]))`, path)
		var got [][]string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %v: %s", what, err, out)
		}
		if len(got) != 2 || strings.Join(got[0], "\n") != strings.Join(want0, "\n") ||
			strings.Join(got[1], "\n") != strings.Join(want1, "\n") {
			t.Errorf("%s: device traces\n%s\nwant device 0\n%s\nand device 1\n%s", what, out,
				strings.Join(want0, "\n"), strings.Join(want1, "\n"))
		}
	}

	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*"))
	}
	if len(files) != 3 {
		t.Fatalf("dump files %v, want 3", files)
	}
	for _, f := range files {
		switch filepath.Ext(f) {
		case ".pickle":
			check("OOM dump", f)
		case ".json":
			data, _ := os.ReadFile(f)
			var rep OOMReport
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatal(err)
			}
			if rep.History.Events != 100 || rep.History.Since == "" {
				t.Errorf("report's history %+v, want 100 events and when they began", rep.History)
			}
		}
	}

	var buf bytes.Buffer
	if err := s.a.Snapshot(context.Background(), &buf, pid); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(t.TempDir(), "snapshot.pickle")
	if err := os.WriteFile(snap, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	check("/snapshot", snap)

	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.HistoryEvents != 100 || st.HistoryBytes != int64(100*historyItemCost) {
		t.Errorf("stats: %d history events, %d bytes; want 100 and %d", st.HistoryEvents, st.HistoryBytes, 100*historyItemCost)
	}
}
