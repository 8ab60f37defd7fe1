package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// session stands in for record.Run: it applies events to a ledger and
// calls the observer as the session's reader goroutine does, ticking
// every few milliseconds.
type session struct {
	t      *testing.T
	a      *Agent
	ledger *ledger.Ledger
	ops    chan func()
	done   chan struct{}
}

func newSession(t *testing.T, opts Options) *session {
	opts.NoSymbolize = true
	s := &session{t: t, a: New(opts), ledger: ledger.New(), ops: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case f, ok := <-s.ops:
				if !ok {
					return
				}
				f()
			case <-tick.C:
				s.a.Tick(&record.Result{Ledger: s.ledger, Lost: 3, Events: 1})
			}
		}
	}()
	t.Cleanup(func() { close(s.ops); <-s.done; s.a.Close() })
	return s
}

// run runs f on the reader goroutine.
func (s *session) run(f func()) {
	done := make(chan struct{})
	s.ops <- func() { f(); close(done) }
	<-done
}

func (s *session) process(pid uint32, comm string) {
	s.run(func() { s.a.Process(&procmodel.Capture{PID: pid, Comm: comm}) })
}

func (s *session) event(ev events.Event) {
	s.run(func() {
		ch := s.ledger.Apply(&ev)
		s.a.Event(&ev, ch)
	})
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestStatsAndRetention(t *testing.T) {
	s := newSession(t, Options{Retention: 300 * time.Millisecond})
	live := uint32(os.Getpid()) // runs for the test's duration
	const gone = 1<<22 + 7      // above pid_max's default: never a process
	s.process(live, "job")
	s.process(gone, "short")
	s.event(events.Event{PID: live, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Device: 1, Stack: []uint64{1}})
	s.event(events.Event{PID: live, Comm: "job", API: events.CudaMalloc, Addr: 0x2000, Size: 50, Device: 1, Stack: []uint64{2}})
	s.event(events.Event{PID: live, Comm: "job", API: events.CudaFree, Addr: 0x2000})
	s.event(events.Event{PID: live, Comm: "job", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Device: 1, Stack: []uint64{3}})
	s.event(events.Event{PID: gone, Comm: "short", API: events.CudaMalloc, Addr: 0x1000, Size: 7, Stack: []uint64{1}})
	// Its end, as the session sends it (its exit record, or its sweep's).
	s.event(events.Event{PID: gone, Comm: "short", API: events.ProcessExit, Flags: events.FlagEntryOnly})

	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 2 {
		t.Fatalf("%d processes, want 2", len(st.Processes))
	}
	p := st.Processes[0]
	if p.PID != live || p.Live != 100 || p.Peak != 150 || p.Allocs != 2 || p.Frees != 1 || p.Failed != 1 || p.OOMs != 1 ||
		len(p.Devices) != 1 || p.Devices[0].Live != 100 || p.Exited {
		t.Errorf("live job: %+v", p)
	}
	if st.Totals.Allocs != 3 || st.Totals.Failed != 1 || st.Totals.OOMs != 1 || st.Lost != 3 {
		t.Errorf("totals %+v lost %d", st.Totals, st.Lost)
	}

	// The gone process is forgotten after the retention; its stacks go
	// with it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err = s.a.Stats(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Processes) == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(st.Processes) != 1 || st.Processes[0].PID != live {
		t.Fatalf("after the retention: processes %+v, want only %d", st.Processes, live)
	}
	if st.Totals.ProcessesExited != 1 || st.Totals.ProcessesForgotten != 1 || st.Stacks != 3 {
		t.Errorf("totals %+v, %d stacks (want 3: the live job's)", st.Totals, st.Stacks)
	}
	s.run(func() {
		if s.ledger.Process(gone) != nil || len(s.ledger.Stacks()) != 3 {
			t.Errorf("the ledger still holds pid %d", gone)
		}
	})
	// The node's sums leave a process out once it exited.
	for _, n := range st.Node {
		if n.Device == 0 && n.Live != 0 || n.Device == 1 && (n.Live != 100 || n.Peak != 150) {
			t.Errorf("node: %+v, want device 1 at 100 live, 150 peak, device 0 empty", n)
		}
	}
	if err := s.a.Known(ctx(t), gone); err == nil {
		t.Error("Known(gone) after the retention: no error")
	}
}

// A process's exit record releases what it held: its live figures drop to
// 0, the node's by what it held, once, whatever else the agent sees of it
// after. (A process gone without one is ended by the session's sweep,
// through the ledger and this same path: record's TestSweepEndsUnseen.)
func TestExitReleases(t *testing.T) {
	s := newSession(t, Options{Retention: time.Hour})
	job, other := uint32(os.Getpid()), uint32(os.Getppid())
	const gone = 1<<22 + 7 // above pid_max's default: never a process
	s.process(job, "job")
	s.process(other, "other")
	s.process(gone, "gone")
	s.event(events.Event{PID: job, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Device: 0, Stack: []uint64{1}})
	s.event(events.Event{PID: job, Comm: "job", API: events.CudaMalloc, Addr: 0x2000, Size: 30, Device: 1, Stack: []uint64{2}})
	s.event(events.Event{PID: other, Comm: "other", API: events.CudaMalloc, Addr: 0x1000, Size: 9, Device: 1, Stack: []uint64{1}})
	s.event(events.Event{PID: gone, Comm: "gone", API: events.CudaMalloc, Addr: 0x1000, Size: 7, Device: 0, Stack: []uint64{1}})
	s.event(events.Event{PID: job, Comm: "job", API: events.ProcessExit, Flags: events.FlagEntryOnly})

	// Twice, the second after the scans ran: nothing is taken twice.
	for round := range 2 {
		st, err := s.a.Stats(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Processes {
			if p.PID == job && (!p.Exited || p.Live != 0 || len(p.Devices) != 2 || p.Devices[0].Live != 0 || p.Devices[1].Live != 0) {
				t.Errorf("round %d: job after its exit: %+v", round, p)
			}
		}
		node := map[int32]uint64{}
		for _, n := range st.Node {
			node[n.Device] = n.Live
		}
		// Device 0: the gone process's 7 until its end comes; device 1: other's 9.
		if round == 1 && (node[0] != 0 || node[1] != 9) || round == 0 && (node[0] != 7 || node[1] != 9) {
			t.Errorf("round %d: node live %v", round, node)
		}
		if round == 1 && st.Totals.ProcessesExited != 2 {
			t.Errorf("processes exited %d, want 2", st.Totals.ProcessesExited)
		}
		if st.Totals.Frees != 0 || st.Totals.ImplicitFrees != 0 {
			t.Errorf("round %d: held at exit counted as frees: %+v", round, st.Totals)
		}
		if round == 0 {
			// The session's sweep ends gone, unseen by an exit record,
			// with a ProcessExit of its making.
			s.event(events.Event{PID: gone, Comm: "gone", API: events.ProcessExit, Flags: events.FlagEntryOnly})
			s.event(events.Event{PID: job, Comm: "job", API: events.ProcessExit, Flags: events.FlagEntryOnly})
		}
	}
	s.run(func() {
		p := s.ledger.Process(job)
		if p == nil || p.HeldAtExitAllocs != 2 || p.HeldAtExitBytes != 130 {
			t.Errorf("job's held at exit: %+v", p)
		}
		if g := s.ledger.Process(gone); g == nil || !g.Exited || g.HeldAtExitBytes != 7 || g.Live != 0 {
			t.Errorf("gone, ended by the sweep's exit: %+v", g)
		}
	})
}

func TestProfileDelta(t *testing.T) {
	s := newSession(t, Options{})
	pid := uint32(os.Getpid())
	s.process(pid, "job")
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Stack: []uint64{1}})
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x2000, Size: 50, Stack: []uint64{2}})
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaFree, Addr: 0x2000})
	values := func() map[uint64][]int64 {
		var buf bytes.Buffer
		if err := s.a.Profile(ctx(t), &buf, 0); err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(&buf)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint64][]int64{}
		for _, smp := range p.Sample {
			out[smp.Location[0].Address] = smp.Value
		}
		return out
	}
	got := values()
	if len(got) != 2 || !equal(got[1], 1, 100, 1, 100) || !equal(got[2], 1, 50, 0, 0) {
		t.Fatalf("first scrape: %v", got)
	}
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x3000, Size: 30, Stack: []uint64{1}})
	got = values()
	if len(got) != 1 || !equal(got[1], 1, 30, 2, 130) {
		t.Fatalf("second scrape: %v, want only stack 1 with [1 30 2 130]", got)
	}
	got = values()
	if len(got) != 1 || !equal(got[1], 0, 0, 2, 130) {
		t.Fatalf("third scrape: %v", got)
	}
	if err := s.a.Profile(ctx(t), &bytes.Buffer{}, 4242424); err == nil {
		t.Error("a profile of an unknown pid: no error")
	}
}

// equal reports whether a GPU memory sample's values are want (its
// alloc_*/inuse_* group) and the tensor and host groups after it are 0.
func equal(v []int64, want ...int64) bool {
	if len(v) != 12 || len(want) != 4 {
		return false
	}
	for i := range v {
		if i < 4 && v[i] != want[i] || i >= 4 && v[i] != 0 {
			return false
		}
	}
	return true
}

func TestOOMDump(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour})
	pid := uint32(os.Getpid())
	s.process(pid, "job")
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Device: 1, Stack: []uint64{1}})
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x20000, Size: 8192, Device: 0, Stack: []uint64{2}})
	for range 3 { // one dump, two skipped by DumpEvery
		s.event(events.Event{PID: pid, TID: 9, Comm: "job", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Device: 1, Stack: []uint64{3, 4}})
	}
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Size: 0, Result: 1, Device: 1, Stack: []uint64{5}}) // not an OOM

	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*"))
	}
	if len(files) != 3 {
		t.Fatalf("dump files %v, want 3", files)
	}
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v mode %v, want 0600", f, err, fi.Mode().Perm())
		}
		if filepath.Ext(f) != ".json" {
			continue
		}
		data, _ := os.ReadFile(f)
		var rep OOMReport
		if err := json.Unmarshal(data, &rep); err != nil {
			t.Fatal(err)
		}
		fl := rep.Failure
		if rep.PID != pid || fl.TID != 9 || fl.Size != 1<<40 || fl.Device != 1 || fl.Error != "cudaErrorMemoryAllocation" ||
			fl.LiveBytes != 4096+8192 || fl.DeviceLiveBytes != 4096 || len(fl.Frames) != 2 || fl.Frames[0].Address != "0x3" ||
			len(fl.LiveStacks) != 1 || fl.LiveStacks[0].LiveBytes != 4096 || rep.Process.LiveAllocations != 2 {
			t.Errorf("report %s", data)
		}
	}
	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Totals.OOMs != 3 || st.Totals.Dumps != 1 || st.Totals.DumpsSkipped != 2 || st.Totals.Failed != 4 {
		t.Errorf("totals %+v: want 3 OOMs, 1 dump, 2 skipped, 4 failed", st.Totals)
	}
}

func TestTraceWindow(t *testing.T) {
	s := newSession(t, Options{})
	pid := uint32(os.Getpid())
	s.process(pid, "job")
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 1, Stack: []uint64{1}}) // before the window
	var buf bytes.Buffer
	errc := make(chan error, 1)
	go func() { errc <- s.a.Trace(ctx(t), &buf, pid, 400*time.Millisecond) }()
	time.Sleep(200 * time.Millisecond) // subscribed (a request settles in 120 ms)
	s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x2000, Size: 2, Stack: []uint64{1}})
	s.event(events.Event{PID: pid + 1, Comm: "other", API: events.CudaMalloc, Addr: 0x2000, Size: 3, Stack: []uint64{1}})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	var types []tracefile.Type
	var sizes []uint64
	var flags []uint16
	readWindow(t, buf.Bytes(), func(rec tracefile.Record) {
		types = append(types, rec.Type)
		if rec.Type == tracefile.TypeEvent {
			sizes = append(sizes, rec.Event.Size)
			flags = append(flags, rec.Event.Flags&events.FlagBefore)
		}
		if rec.Type == tracefile.TypeEnd && rec.End.Events != 2 {
			t.Errorf("end record: %d events, want 2", rec.End.Events)
		}
	})
	// The window starts with what the agent held live (the 1-byte
	// allocation, flagged as made before it), then the 2-byte one.
	want := []tracefile.Type{tracefile.TypeProcess, tracefile.TypeEvent, tracefile.TypeEvent, tracefile.TypeCounters, tracefile.TypeEnd}
	if len(types) != len(want) || !slices.Equal(sizes, []uint64{1, 2}) || !slices.Equal(flags, []uint16{events.FlagBefore, 0}) {
		t.Fatalf("frames %v (event sizes %v, flags %v), want %v with the 1-byte allocation live before, then the 2-byte one",
			types, sizes, flags, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("frames %v, want %v", types, want)
		}
	}
}

// TestPIDReused: a capture of the same PID with another start time is
// another process: the old one's account is dropped, the new one starts
// from nothing.
func TestPIDReused(t *testing.T) {
	s := newSession(t, Options{})
	pid := uint32(os.Getpid())
	time.Sleep(20 * time.Millisecond) // a Tick has handed over the ledger
	s.run(func() { s.a.Process(&procmodel.Capture{PID: pid, Comm: "old", Start: 100}) })
	s.event(events.Event{PID: pid, Comm: "old", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Stack: []uint64{1}})
	s.run(func() { s.a.Process(&procmodel.Capture{PID: pid, Comm: "old", Start: 100}) }) // a recapture: the same process
	s.event(events.Event{PID: pid, Comm: "old", API: events.CudaMalloc, Addr: 0x2000, Size: 10, Stack: []uint64{1}})
	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 1 || st.Processes[0].Live != 110 || st.Processes[0].Allocs != 2 {
		t.Fatalf("before reuse: %+v", st.Processes)
	}
	s.run(func() { s.a.Process(&procmodel.Capture{PID: pid, Comm: "new", Start: 200}) })
	s.event(events.Event{PID: pid, Comm: "new", API: events.CudaMalloc, Addr: 0x1000, Size: 7, Stack: []uint64{1}})
	st, err = s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 1 || st.Processes[0].Comm != "new" || st.Processes[0].Live != 7 || st.Processes[0].Allocs != 1 ||
		st.Processes[0].Peak != 7 || st.Stacks != 1 {
		t.Fatalf("after reuse: %+v, %d stacks", st.Processes, st.Stacks)
	}
}

// readWindow writes a trace window's bytes to a file, calls each with
// every record of it (Event is reused from one call to the next, as
// tracefile.Reader's), and returns the file's path.
func readWindow(t *testing.T, data []byte, each func(tracefile.Record)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "w.trace")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := tracefile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return path
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		each(rec)
	}
}

// TestOOMDumpProcess: the dump's process account is the report's, every
// field of it: a lost free (replaced), tensor bytes and when the peak was
// reached are in it, as `cudatrace report` shows them.
func TestOOMDumpProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour})
	pid := uint32(os.Getpid())
	s.process(pid, "job")
	s.event(events.Event{Time: 1000, PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Stack: []uint64{1}})
	s.event(events.Event{Time: 2000, PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 8192, Stack: []uint64{1}})
	s.event(events.Event{Time: 3000, PID: pid, Comm: "job", API: events.TorchMalloc, Addr: 0x10000, Size: 1000, Stack: []uint64{2}})
	s.event(events.Event{Time: 5000, PID: pid, TID: 9, Comm: "job", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{3}})

	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*.json"))
	}
	if len(files) != 1 {
		t.Fatalf("dump reports %v, want 1", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var rep OOMReport
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	p := rep.Process
	if p.Replaced != 1 || p.LiveBytes != 8192 || p.PeakBytes != 8192 || p.AllocBytes != 4096+8192 || p.TensorAllocBytes != 1000 ||
		p.TensorLiveBytes != 1000 || p.LiveAllocations != 1 || p.Comm != "job" {
		t.Errorf("process %s", data)
	}
	peak, err1 := time.Parse(time.RFC3339Nano, p.PeakTime)
	failed, err2 := time.Parse(time.RFC3339Nano, rep.Failure.Time)
	if err1 != nil || err2 != nil || failed.Sub(peak) != 3000*time.Nanosecond {
		t.Errorf("peak_time %q, failure time %q: want the peak 3000 ns before the failure (%v, %v)", p.PeakTime, rep.Failure.Time, err1, err2)
	}
}

// TestLostWhileStopping: the agent serves the losses while serving only;
// those counted after the stop began (res.LostStopping) are the exit
// line's, so cudatrace_lost_events_total never shows what the exit line
// calls lost while stopping.
func TestLostWhileStopping(t *testing.T) {
	a := New(Options{NoSymbolize: true})
	defer a.Close()
	for _, c := range []struct{ lost, stopping, want uint64 }{
		{3, 0, 3},  // serving
		{9, 0, 9},  // more lost while serving
		{15, 6, 9}, // the stop's final tick: 6 more, all while stopping
	} {
		a.Tick(&record.Result{Ledger: ledger.New(), Lost: c.lost, LostStopping: c.stopping})
		if st := a.stats(); st.Lost != c.want {
			t.Errorf("Lost %d, LostStopping %d: the agent serves %d lost, want %d", c.lost, c.stopping, st.Lost, c.want)
		}
	}
}

// The OOM dump's memviz entry carries the device's free memory from the
// driver's latest sample when there is one, and leaves device_free out
// (not 0) when nothing says how large the device is.
func TestOOMDumpDeviceFree(t *testing.T) {
	for _, c := range []struct {
		nvml *gpustat.Sample
		want int64
	}{
		{&gpustat.Sample{Devices: []gpustat.Device{{Index: 0, Total: 16 << 30, Free: 9 << 30}, {Index: 1, Total: 16 << 30, Free: 3 << 30}}}, 3 << 30},
		{nil, -1},
	} {
		dir := filepath.Join(t.TempDir(), "oom")
		s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour})
		pid := uint32(os.Getpid())
		s.process(pid, "job")
		s.event(events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Device: 1, Stack: []uint64{1}})
		s.run(func() {
			s.a.Tick(&record.Result{Ledger: s.ledger, NVML: c.nvml})
			ev := events.Event{PID: pid, TID: 9, Comm: "job", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Device: 1, Stack: []uint64{3}}
			s.a.Event(&ev, s.ledger.Apply(&ev))
		})
		var files []string
		for deadline := time.Now().Add(5 * time.Second); len(files) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			files, _ = filepath.Glob(filepath.Join(dir, "oom-*.pickle"))
		}
		if len(files) != 1 {
			t.Fatalf("memviz dumps %v, want 1", files)
		}
		sum := memviztest.Check(t, files[0], memviztest.Want{DeviceKnown: c.nvml != nil})
		if len(sum.DeviceFree) != 1 || sum.DeviceFree[0] != c.want {
			t.Errorf("NVML %v: oom device_free %v, want [%d] (-1: left out)", c.nvml, sum.DeviceFree, c.want)
		}
		// /snapshot's oom entry: the driver's figure at the failure, though
		// the agent's later ticks carry no NVML sample.
		var buf bytes.Buffer
		if err := s.a.Snapshot(context.Background(), &buf, pid); err != nil {
			t.Fatal(err)
		}
		snap := filepath.Join(t.TempDir(), "snapshot.pickle")
		if err := os.WriteFile(snap, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		sum = memviztest.Check(t, snap, memviztest.Want{DeviceKnown: c.nvml != nil})
		if len(sum.DeviceFree) != 1 || sum.DeviceFree[0] != c.want {
			t.Errorf("NVML %v: /snapshot oom device_free %v, want [%d] (-1: left out)", c.nvml, sum.DeviceFree, c.want)
		}
	}
}

// TestStackLabel: a stack's label is its innermost frames, by function
// and file:line, a frame without a function by its module and offset,
// never a runtime address.
func TestStackLabel(t *testing.T) {
	frames := []symbolize.Frame{
		{Addr: 0x7f0000001234, Function: "load_weights", File: "/src/agentload.c", Line: 21, Module: "/bin/agentload"},
		{Addr: 0x7f0000005678, Function: "run", Module: "/bin/agentload"},
		{Addr: 0x7f00000abcde, Module: "/usr/lib/libfoo.so.1", Offset: 0xbcde},
		{Addr: 0x7f00000fffff},
		{Addr: 0x400000, Function: "main", File: "/src/agentload.c", Line: 99},
	}
	want := "load_weights (agentload.c:21) < run < libfoo.so.1+0xbcde < ?"
	if got := stackLabel(frames); got != want {
		t.Errorf("stackLabel = %q, want %q", got, want)
	}
	if got := stackLabel(nil); got != "" {
		t.Errorf("stackLabel(nil) = %q, want \"\"", got)
	}
}
