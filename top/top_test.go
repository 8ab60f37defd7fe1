package top

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/symbolize"
)

// clock is a settable time for the collector.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var collector *Collector // the one the test's events go to

func alloc(l *ledger.Ledger, pid uint32, comm string, addr, size uint64, dev int32, api events.API, stack ...uint64) {
	ev := &events.Event{Time: addr, PID: pid, TID: pid, Comm: comm, API: api, Addr: addr, Size: size, Device: dev, Stack: stack}
	collector.Event(ev, l.Apply(ev))
}

// The cross-check with a fake NVML, and the rates, to the byte.
func TestCollector(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}
	c := NewCollector(time.Second, 2, nil)
	c.now, c.start = clk.now, clk.t
	c.comm[300] = "jax" // as /proc would say
	// 0xb returns into NCCL: its 3000 bytes are NCCL's.
	c.Process(&procmodel.Capture{PID: 100, Maps: []proc.Mapping{{Start: 0xa, End: 0xb, Path: "/venv/nvidia/nccl/lib/libnccl.so.2"}}})
	collector = c
	l := ledger.New()
	res := &record.Result{Ledger: l, Events: 3}
	alloc(l, 100, "train", 0x1000, 1000, 0, events.CudaMalloc, 0xa)
	alloc(l, 100, "train", 0x2000, 3000, 1, events.CudaMalloc, 0xb)
	alloc(l, 100, "train", 0x3000, 64, 0, events.CudaMallocHost, 0xc)
	alloc(l, 200, "eval", 0x1000, 500, 0, events.CudaMalloc, 0xd)
	fake := &gpustat.Fake{
		Devs: []gpustat.Device{{Index: 0, UUID: "GPU-0", Name: "Fake", Total: 1 << 20, Used: 9000, Free: 1<<20 - 9000},
			{Index: 1, UUID: "GPU-1", Name: "Fake", Total: 1 << 20, Used: 4000, Free: 1<<20 - 4000}},
		Procs: []gpustat.ProcessUsage{{PID: 100, Device: 0, UUID: "GPU-0", Used: 1500}, {PID: 100, Device: 1, UUID: "GPU-1", Used: 3500},
			{PID: 300, Device: 0, UUID: "GPU-0", Used: 2000}, {PID: 300, Device: 1, UUID: "GPU-1", Used: 100}},
	}
	sm, _, err := gpustat.Take(fake, nil)
	if err != nil {
		t.Fatal(err)
	}
	res.NVML = &sm
	c.Tick(res)
	s := c.Snapshot()
	if s == nil || s.Seq != 1 {
		t.Fatalf("snapshot %+v", s)
	}
	want := []Process{
		{PID: 100, Comm: "train", Live: 4000, Peak: 4000, LiveCount: 2, Allocs: 3, AllocBytes: 4064, NVMLUsed: 5000, Listed: true,
			Owners: []OwnerBytes{{"nccl", 3000}, {"application", 1000}}},
		{PID: 200, Comm: "eval", Live: 500, Peak: 500, LiveCount: 1, Allocs: 1, AllocBytes: 500, Owners: []OwnerBytes{{"application", 500}}},
		// On the GPU, never traced: all of its memory is the remainder.
		{PID: 300, Comm: "jax", NVMLUsed: 2100, Listed: true},
	}
	if !reflect.DeepEqual(s.Processes, want) {
		t.Errorf("processes\n got %+v\nwant %+v", s.Processes, want)
	}
	if r := s.Processes[0].Remainder(); r != 1000 {
		t.Errorf("remainder %d, want 5000 - 4000", r)
	}
	if r := s.Processes[2].Remainder(); r != 2100 {
		t.Errorf("untraced remainder %d, want 2100", r)
	}
	// --pid 100: the untraced process is not shown.
	only := NewCollector(time.Second, 2, []int{100})
	only.Tick(res)
	if ps := only.Snapshot().Processes; len(ps) != 2 || ps[1].PID != 200 {
		t.Errorf("with --pid 100: %+v", ps)
	}
	if len(s.Devices) != 2 || s.Devices[0].Live != 1500 || s.Devices[0].NVML.Used != 9000 || s.Devices[1].Live != 3000 {
		t.Errorf("devices %+v", s.Devices)
	}
	// Stacks of the first process (none selected), most live first.
	if s.StacksPID != 100 || len(s.Stacks) != 2 || s.Stacks[0].Live != 3000 || s.Stacks[1].Live != 1000 ||
		!reflect.DeepEqual(s.Stacks[0].Frames, []uint64{0xb}) {
		t.Errorf("stacks of %d: %+v", s.StacksPID, s.Stacks)
	}

	// Half a second later: no new snapshot. At 2 s: rates over the 2 s.
	clk.t = clk.t.Add(500 * time.Millisecond)
	c.Tick(res)
	if c.Snapshot().Seq != 1 {
		t.Fatal("a snapshot before the refresh interval passed")
	}
	alloc(l, 200, "eval", 0x2000, 7000, 0, events.CudaMalloc, 0xe)
	alloc(l, 200, "eval", 0x3000, 1000, 0, events.CudaMalloc, 0xe)
	alloc(l, 100, "train", 0x3000, 0, 0, events.CudaFreeHost) // host memory: no change in the GPU count
	alloc(l, 100, "train", 0x1000, 0, 0, events.CudaFree)
	clk.t = clk.t.Add(1500 * time.Millisecond)
	c.Tick(res)
	s = c.Snapshot()
	if s.Seq != 2 || s.Processes[0].PID != 200 || s.Processes[0].AllocRate != 1 || s.Processes[0].ByteRate != 4000 ||
		s.Processes[0].LiveCount != 3 || s.Processes[1].AllocRate != 0 || s.Processes[1].LiveCount != 1 || s.Processes[1].Live != 3000 ||
		len(s.Processes) != 3 {
		t.Errorf("after 2 s: %+v", s.Processes)
	}
	// The true peak, 1500 + 7000 + 1000 before train's free, which no
	// refresh saw.
	if s.Devices[0].Live != 8500 || s.Devices[0].Peak != 9500 {
		t.Errorf("device 0 %+v", s.Devices[0])
	}

	// Selecting a process brings its stacks at the next tick, not a second later.
	c.Select(100)
	clk.t = clk.t.Add(10 * time.Millisecond)
	c.Tick(res)
	s = c.Snapshot()
	if s.Seq != 2 || s.StacksPID != 100 || len(s.Stacks) != 1 || s.Stacks[0].Live != 3000 || s.Processes[0].AllocRate != 1 {
		t.Errorf("after select: seq %d stacks of %d %+v", s.Seq, s.StacksPID, s.Processes)
	}
	select {
	case <-c.Updated():
	default:
		t.Error("Updated not signalled")
	}
}

func testSnapshot() *Snapshot {
	nd := gpustat.Device{Index: 0, UUID: "GPU-0", Name: "Fake H100", Total: 80 << 30, Used: 3 << 30, Free: 77 << 30}
	return &Snapshot{Seq: 4, Elapsed: 12 * time.Second, Events: 99, Lost: 1, NVML: true,
		Devices: []Device{{Number: 0, Live: 2 << 30, Peak: 5 << 29, NVML: &nd}, {Number: 1, Live: 512, Peak: 512}},
		Processes: []Process{
			{PID: 4242, Comm: "python3", Live: 2 << 30, Peak: 5 << 29, LiveCount: 3, TensorLive: 1 << 30, Allocs: 10, AllocBytes: 3 << 30,
				NVMLUsed: 2<<30 + 300<<20, Listed: true, AllocRate: 2.5, ByteRate: 1 << 20,
				Owners: []OwnerBytes{{"pytorch", 3 << 29}, {"nccl", 1 << 29}}},
			{PID: 77, Comm: "other", Live: 512, Peak: 512, LiveCount: 1, Allocs: 1, AllocBytes: 512},
		},
		StacksPID: 4242,
		Stacks:    []Stack{{Live: 2 << 30, LiveCount: 2, Frames: []uint64{0x10, 0x20}}, {Live: 1, LiveCount: 1, Tensor: true, Frames: []uint64{0x30}}},
	}
}

func TestScreen(t *testing.T) {
	frames := func(st *Stack) []symbolize.Frame {
		var out []symbolize.Frame
		for _, pc := range st.Frames {
			f := symbolize.Frame{Addr: pc}
			if pc == 0x10 {
				f.Function, f.File, f.Line, f.Module = "train_step", "/src/train.c", 42, "/opt/train"
			}
			out = append(out, f)
		}
		return out
	}
	got := Screen(testSnapshot(), View{Selected: 4242, Width: 200, Height: 30, Every: time.Second, Target: "all processes",
		Status: "cudatrace: attached 26 probes"}, frames)
	want := []string{
		"cudatrace top: all processes, every 1s, 12s elapsed, 99 events, 1 lost   q quit, j/k or arrows select",
		"",
		"GPU   TRACED     PEAK  NVML-USED  REMAINDER     TOTAL  NAME",
		"  0  2.0 GiB  2.5 GiB    3.0 GiB   +1.0 GiB  80.0 GiB  Fake H100",
		"  1    512 B    512 B          -          -         -",
		"",
		"    PID  COMM        LIVE     PEAK  TENSORS  NVML-USED   REMAINDER  ALLOCS/S  BYTES/S  MOST BY",
		">  4242  python3  2.0 GiB  2.5 GiB  1.0 GiB    2.3 GiB  +300.0 MiB       2.5  1.0 MiB  pytorch",
		"     77  other      512 B    512 B        -          -           -       0.0      0 B  -",
		"",
		"pid 4242 (python3): 2.0 GiB of GPU memory live in 3 allocations, peak 2.5 GiB; 10 allocations, 3.0 GiB, since tracing began",
		"by owner: pytorch 1.5 GiB, nccl 512.0 MiB",
		"[1] 2.0 GiB live in 2 allocations",
		"    #0 train_step (train.c:42) train",
		"    #1 0x20",
		"[2] tensors: 1 B live in 1 allocation",
		"    #0 0x30",
	}
	for len(want) < 29 {
		want = append(want, "")
	}
	want = append(want, "cudatrace: attached 26 probes")
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("screen\n--- got\n%s\n--- want\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// An untraced process NVML lists, selected.
	s := testSnapshot()
	s.Processes = append(s.Processes, Process{PID: 9, Comm: "jax", NVMLUsed: 4096, Listed: true})
	lines := Screen(s, View{Selected: 9, Width: 200, Height: 30}, frames)
	if want := "pid 9 (jax): no allocation traced; NVML charges it 4.0 KiB: it allocated before tracing began, or through a library not probed (--lib)"; !contains(lines, want) {
		t.Errorf("no line %q in\n%s", want, strings.Join(lines, "\n"))
	}
	// Ranks of a job: JOB and RANK columns, and the selected one named by
	// them.
	s = testSnapshot()
	s.Processes[0].Job, s.Processes[0].Rank, s.Processes[0].Ranked = "slurm:42.0", 3, true
	lines = Screen(s, View{Selected: 4242, Width: 200, Height: 30}, frames)
	for _, want := range []string{
		"    PID  COMM     JOB         RANK     LIVE     PEAK  TENSORS  NVML-USED   REMAINDER  ALLOCS/S  BYTES/S  MOST BY",
		">  4242  python3  slurm:42.0     3  2.0 GiB  2.5 GiB  1.0 GiB    2.3 GiB  +300.0 MiB       2.5  1.0 MiB  pytorch",
		"pid 4242 (python3, rank 3 of slurm:42.0): 2.0 GiB of GPU memory live in 3 allocations, peak 2.5 GiB; 10 allocations, 3.0 GiB, since tracing began",
	} {
		if !contains(lines, want) {
			t.Errorf("no line %q in\n%s", want, strings.Join(lines, "\n"))
		}
	}
	// A small terminal: clipped to its size.
	small := Screen(testSnapshot(), View{Selected: 77, Width: 20, Height: 5}, frames)
	if len(small) != 5 || small[4] != "  1    512 B    512 " || len([]rune(small[0])) != 20 {
		t.Errorf("20x5 screen: %q", small)
	}
}

func TestWriteLines(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteLines(&buf, testSnapshot(), time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	want := "" +
		"2026-01-02T15:04:05Z gpu=0 live=2147483648 peak=2684354560 nvml_used=3221225472 remainder=1073741824 total=85899345920\n" +
		"2026-01-02T15:04:05Z gpu=1 live=512 peak=512 nvml_used=- remainder=-\n" +
		"2026-01-02T15:04:05Z pid=4242 comm=\"python3\" live=2147483648 peak=2684354560 live_allocations=3 allocs=10 alloc_bytes=3221225472 nvml_used=2462056448 remainder=314572800 alloc_rate=2.5 byte_rate=1048576 owners=pytorch:1610612736,nccl:536870912\n" +
		"2026-01-02T15:04:05Z pid=77 comm=\"other\" live=512 peak=512 live_allocations=1 allocs=1 alloc_bytes=512 nvml_used=- remainder=- alloc_rate=0.0 byte_rate=0\n"
	if buf.String() != want {
		t.Errorf("lines\n--- got\n%s--- want\n%s", buf.String(), want)
	}
}

func TestReadKeys(t *testing.T) {
	keys := make(chan key, 16)
	readKeys(strings.NewReader("jk\x1b[A\x1b[B\x1bOAx\x1bOBQ"), keys)
	var got []key
	for len(keys) > 0 {
		got = append(got, <-keys)
	}
	// The last quit is the end of input: a closed terminal quits too.
	want := []key{keyDown, keyUp, keyUp, keyDown, keyUp, keyDown, keyQuit, keyQuit}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
}

func TestMessages(t *testing.T) {
	var m Messages
	m.Write([]byte("cudatrace: attached 2 probes\ncudatrace: NVML unav"))
	if m.Last() != "cudatrace: attached 2 probes" {
		t.Errorf("last %q", m.Last())
	}
	m.Write([]byte("ailable: Driver Not Loaded\n"))
	if m.Last() != "cudatrace: NVML unavailable: Driver Not Loaded" || len(m.Lines()) != 2 {
		t.Errorf("last %q, lines %q", m.Last(), m.Lines())
	}
}

func contains(lines []string, s string) bool {
	for _, l := range lines {
		if l == s {
			return true
		}
	}
	return false
}

// A stack is named from the mappings its process had when the stack was
// first seen, as report does, not from the latest: an exec or a dlopen
// after it maps other files at the same addresses.
func TestStackNamedFromItsCapture(t *testing.T) {
	c := NewCollector(time.Second, 5, nil)
	collector = c
	l := ledger.New()
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

// A process's end releases every allocation it held at once: its live
// count drops to 0 with its bytes.
func TestCollectorExit(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)}
	c := NewCollector(time.Second, 2, nil)
	c.now, c.start = clk.now, clk.t
	collector = c
	l := ledger.New()
	res := &record.Result{Ledger: l, Events: 4}
	alloc(l, 100, "train", 0x1000, 1000, 0, events.CudaMalloc, 0xa)
	alloc(l, 100, "train", 0x2000, 3000, 1, events.CudaMalloc, 0xb)
	alloc(l, 100, "train", 0x3000, 500, 1, events.CudaMalloc, 0xb)
	ev := &events.Event{Time: 0x4000, PID: 100, TID: 100, Comm: "train", API: events.ProcessExit, Flags: events.FlagEntryOnly}
	c.Event(ev, l.Apply(ev))
	c.Tick(res)
	s := c.Snapshot()
	if s == nil || len(s.Processes) != 1 || s.Processes[0].Live != 0 || s.Processes[0].LiveCount != 0 {
		t.Fatalf("after its exit: %+v", s)
	}
	for _, d := range s.Devices {
		if d.Live != 0 {
			t.Errorf("device %d: %d live after the only process ended", d.Number, d.Live)
		}
	}
}
