package tracefile

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
)

// A frame written to a sample trace, with where it landed and what reading
// it back must give.
type want struct {
	typ      Type
	off, end int    // of the whole frame in the file
	raw      []byte // payload
	ev       *events.Event
	process  *Process
	attach   *Attach
	counters *Counters
	end_     *End
	nvml     *NVML
	python   *Python
	symbols  *Symbols
}

type sample struct {
	meta    Meta
	data    []byte
	metaEnd int    // end of the meta frame
	frames  []want // after the meta frame
}

func testMeta() Meta {
	return Meta{
		Tool:      "cudatrace v0.1.0-test",
		Host:      "gpu-node-7",
		Kernel:    "6.8.0-45-generic",
		StartWall: time.Date(2025, 3, 14, 15, 9, 26, 535897932, time.UTC),
		StartBoot: 1_234_567_890_123,
		Command:   []string{"python3", "train.py", "--epochs", "3"},
		PIDs:      []int{4242, 4343},
		All:       true,
		ClockPair: 1463,
		Clock:     &ClockSync{Synced: true, EstError: 250_000, MaxError: 16_000_000_000},
		Nodes: []Node{{Host: "gpu-node-7", Kernel: "6.8.0-45-generic", Tool: "cudatrace v0.1.0-test", Trace: "a.trace",
			StartWall: time.Date(2025, 3, 14, 15, 9, 25, 0, time.UTC), StartBoot: 5, ClockPair: 900, Offset: -7}},
	}
}

var testAPIs = []events.API{events.CudaMalloc, events.CudaMallocAsync, events.CudaMallocManaged,
	events.CudaMallocPitch, events.CudaMalloc3D, events.CudaMallocHost, events.CudaHostAlloc}

// sampleEvents are representable exactly by events.Encode: comms of at most
// 15 bytes, at most MaxFrames frames, no stack with a StackErr.
func sampleEvents() []events.Event {
	comms := []string{"python3", "pt_main_thread", "", "abcdefghijklmno"}
	var evs []events.Event
	for i := range 40 {
		ev := events.Event{
			Time:     1_234_567_890_123 + uint64(i)*1_000_003,
			Duration: uint64(i) * 17,
			PID:      4242,
			TID:      4242 + uint32(i%3),
			Comm:     comms[i%len(comms)],
			API:      testAPIs[i%len(testAPIs)],
			Addr:     0x7f00_0000_0000 + uint64(i)<<20,
			Size:     uint64(1) << (i % 40),
			Device:   int32(i % 4),
		}
		for d := range i % 21 {
			ev.Stack = append(ev.Stack, 0x5555_5555_0000+uint64(i)*0x100+uint64(d)*8)
		}
		evs = append(evs, ev)
	}
	return append(evs,
		// A failed allocation whose stack could not be read.
		events.Event{Time: 2_000_000_000_000, Duration: 999, PID: 4343, TID: 4350, Comm: "worker",
			API: events.CudaMalloc, Size: 80 << 30, Device: 1, Result: 2, StackErr: -14},
		// A free, recorded at entry.
		events.Event{Time: 2_000_000_000_001, PID: 4343, TID: 4350, Comm: "worker", API: events.CudaFree,
			Addr: 0x7f00_0000_0000, Device: -1, Flags: events.FlagEntryOnly},
		// Every frame slot used; extreme values.
		events.Event{Time: math.MaxUint64, Duration: math.MaxUint64, PID: math.MaxUint32, TID: math.MaxUint32,
			Comm: "x", API: events.API(0xfffe), Addr: math.MaxUint64, Size: math.MaxUint64,
			Device: math.MinInt32, Result: -1, Flags: events.FlagStackTrunc | 0x8000,
			Stack: func() []uint64 {
				s := make([]uint64, events.MaxFrames)
				for i := range s {
					s[i] = math.MaxUint64 - uint64(i)
				}
				return s
			}()},
	)
}

func sampleProcesses() []*Process {
	return []*Process{
		{
			PID: 4242, PPID: 4000, Comm: "python3",
			Cmdline: []string{"python3", "train.py", "--epochs", "3"},
			Exe:     "/usr/bin/python3.12", Time: 1_234_567_990_000,
			Maps: []Mapping{
				{Start: 0x5555_5555_4000, End: 0x5555_5589_a000, Offset: 0x1000, Perms: "r-xp", Dev: "fd:01",
					Inode: 1_311_254, Path: "/usr/bin/python3.12", BuildID: "3bd0e9c0c1bd54d51f0d1c2a9a70e5bd3f4b1e21"},
				{Start: 0x7f12_3400_0000, End: 0x7f12_3480_0000, Offset: 0x2_0000, Perms: "r-xp", Dev: "103:02",
					Inode: 99, Path: "/usr/local/cuda/lib64/libcudart.so.12.4.127", BuildID: "0123456789abcdef0123456789abcdef01234567"},
				{Start: 0x7f12_3500_0000, End: 0x7f12_3501_0000, Perms: "r-xp", Inode: 7, Path: "/tmp/no build id"},
			},
			Root: "/proc/4242/root",
			Job: &Job{ID: "slurm:42.0", Name: "train", Launcher: "slurm", Rank: new(int), LocalRank: new(int), WorldSize: 8,
				Vars: []string{"SLURM_JOB_ID=42", "SLURM_PROCID=0"}},
			Node: "gpu-node-7", NodePID: 77,
		},
		{PID: 4343, Comm: "worker", Time: 1_234_568_000_000,
			Error:    "exited before its mappings could be read (no such process): its stacks are not symbolized",
			JobError: "its environment could not be read (…): its job and rank are unknown"},
	}
}

func sampleAttaches() []*Attach {
	return []*Attach{
		{Library: "/usr/local/cuda/lib64/libcudart.so.12.4.127", BuildID: "0123456789abcdef0123456789abcdef01234567",
			Symbols: []string{"cudaMalloc", "cudaFree", "cudaMallocAsync"}, Missing: []string{"cudaMallocFromPoolAsync"}},
		{Library: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Symbols: []string{"cuMemAlloc_v2"}},
	}
}

func sampleCounters(t uint64) *Counters {
	return &Counters{Time: t, Lost: 3, Counters: map[string]uint64{
		"events": 43, "ringbuf_full": 1, "inflight_full": 0, "no_entry": 2, "stale_entry": 0,
		"nested": 5, "stack_error": 1, "from_the_future": math.MaxUint64}}
}

func sampleNVML() []*NVML {
	return []*NVML{
		{Time: 2e12, Error: "NVML unavailable: Driver Not Loaded"},
		{Time: 2e12 + 1, Devices: []NVMLDevice{
			{Index: 0, UUID: "GPU-0c2a5b31-9c1e-4c3d-8f00-000000000000", Name: "NVIDIA H100 80GB HBM3",
				Total: 85899345920, Used: 1 << 30, Free: 85899345920 - 1<<30},
			{Index: 1, UUID: "GPU-1", Total: 1 << 34}},
			Processes: []NVMLProcess{{PID: 4242, Device: 0, UUID: "GPU-0c2a5b31-9c1e-4c3d-8f00-000000000000", Used: 1<<30 - 1}}},
	}
}

// buildSample writes a trace with every frame type, flushing after each
// frame to learn its extent.
func buildSample(t testing.TB) *sample {
	t.Helper()
	var buf bytes.Buffer
	s := &sample{meta: testMeta()}
	w, err := NewWriter(&buf, s.meta)
	if err != nil {
		t.Fatal(err)
	}
	s.metaEnd = buf.Len()
	add := func(wf want, write func() error) {
		t.Helper()
		off := buf.Len()
		if err := write(); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		wf.off, wf.end = off, buf.Len()
		wf.raw = slices.Clone(buf.Bytes()[off+5 : buf.Len()-4])
		s.frames = append(s.frames, wf)
	}
	for _, a := range sampleAttaches() {
		add(want{typ: TypeAttach, attach: a}, func() error { return w.WriteAttach(a) })
	}
	procs := sampleProcesses()
	add(want{typ: TypeProcess, process: procs[0]}, func() error { return w.WriteProcess(procs[0]) })
	py := &Python{PID: procs[0].PID, Minor: 12, Eval: [][2]uint64{{0x7f0000010000, 0x7f0000012000}},
		Codes: []PyCode{{Code: 0x7f0000100000, Units: 17, File: "/srv/train.py", Function: "Model.forward", Line: 42},
			{Code: 0x7f0000200000, Units: 3, Error: "read 8 bytes at 0x7f0000200000: input/output error"}}}
	add(want{typ: TypePython, python: py}, func() error { return w.WritePython(py) })
	syms := &Symbols{Frames: []Symbol{{BuildID: "3e5d5d2a4f4f6da8b15e007164ddc4b8b75d703e", Offset: 0x1181, VAddr: 0x1181,
		Function: "container_alloc", File: "/src/work.c", Line: 35}, {BuildID: "ab", Offset: 7}}}
	add(want{typ: TypeSymbols, symbols: syms}, func() error { return w.WriteSymbols(syms) })
	evs := sampleEvents()
	for i := range evs {
		ev := &evs[i]
		raw := events.Encode(nil, ev)
		if i == 7 {
			// The BPF side reserves a whole ct_alloc_event: the tail past
			// the stack travels along, zeroed.
			raw = append(raw, make([]byte, 72+8*events.MaxFrames-len(raw))...)
		}
		add(want{typ: TypeEvent, ev: ev}, func() error { return w.WriteEvent(raw) })
		if !bytes.Equal(s.frames[len(s.frames)-1].raw, raw) {
			t.Fatalf("event %d: payload is not the record written", i)
		}
		switch i {
		case 20:
			add(want{typ: TypeCounters, counters: sampleCounters(ev.Time)}, func() error { return w.WriteCounters(sampleCounters(ev.Time)) })
		case 30:
			add(want{typ: TypeProcess, process: procs[1]}, func() error { return w.WriteProcess(procs[1]) })
		}
	}
	for _, n := range sampleNVML() {
		add(want{typ: TypeNVML, nvml: n}, func() error { return w.WriteNVML(n) })
	}
	add(want{typ: TypeCounters, counters: sampleCounters(3e12)}, func() error { return w.WriteCounters(sampleCounters(3e12)) })
	e := &End{Time: 3_000_000_000_000, Events: uint64(len(evs)), Reason: "command exited", ExitCode: 3,
		Nodes: []NodeEnd{{Host: "gpu-node-7", Events: 9, Lost: 1, Warning: "truncated"}}}
	add(want{typ: TypeEnd, end_: e}, func() error { return w.WriteEnd(e) })
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s.data = buf.Bytes()
	if s.frames[len(s.frames)-1].end != len(s.data) {
		t.Fatal("Close wrote more")
	}
	return s
}

// got is a Record copied out of the Reader's reused buffers.
type got struct {
	Record
	ev events.Event
}

func copyRecord(rec Record) got {
	g := got{Record: rec}
	g.Raw = slices.Clone(rec.Raw)
	if rec.Event != nil {
		g.ev = *rec.Event
		g.ev.Stack = slices.Clone(rec.Event.Stack)
		g.Event = &g.ev
	}
	return g
}

// readAll reads to the end; err is what ended it (io.EOF when clean).
func readAll(r *Reader) (recs []got, err error) {
	for {
		rec, err := r.Next()
		if err != nil {
			return recs, err
		}
		recs = append(recs, copyRecord(rec))
	}
}

func eventsEqual(a, b *events.Event) bool {
	return a.Time == b.Time && a.Duration == b.Duration && a.PID == b.PID && a.TID == b.TID &&
		a.Comm == b.Comm && a.API == b.API && a.Addr == b.Addr && a.Size == b.Size &&
		a.Device == b.Device && a.Result == b.Result && a.Flags == b.Flags &&
		slices.Equal(a.Stack, b.Stack) && a.StackErr == b.StackErr
}

// checkFrame asserts that g is exactly w, with only the typed field for its
// type set.
func checkFrame(t *testing.T, i int, g got, w want) {
	t.Helper()
	if g.Type != w.typ || g.Offset != int64(w.off) || !bytes.Equal(g.Raw, w.raw) {
		t.Fatalf("frame %d: got %s at %d (%d bytes), want %s at %d (%d bytes)",
			i, g.Type, g.Offset, len(g.Raw), w.typ, w.off, len(w.raw))
	}
	set := 0
	for _, p := range []bool{g.Event != nil, g.Process != nil, g.Attach != nil, g.Counters != nil, g.End != nil, g.NVML != nil, g.Python != nil, g.Symbols != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		t.Fatalf("frame %d (%s): %d typed fields set", i, g.Type, set)
	}
	switch w.typ {
	case TypeEvent:
		if g.Event == nil || !eventsEqual(g.Event, w.ev) {
			t.Fatalf("frame %d: event\n got %+v\nwant %+v", i, g.Event, w.ev)
		}
	case TypeProcess:
		if !reflect.DeepEqual(g.Process, w.process) {
			t.Fatalf("frame %d: process\n got %+v\nwant %+v", i, g.Process, w.process)
		}
	case TypeAttach:
		if !reflect.DeepEqual(g.Attach, w.attach) {
			t.Fatalf("frame %d: attach\n got %+v\nwant %+v", i, g.Attach, w.attach)
		}
	case TypeCounters:
		if !reflect.DeepEqual(g.Counters, w.counters) {
			t.Fatalf("frame %d: counters\n got %+v\nwant %+v", i, g.Counters, w.counters)
		}
	case TypeEnd:
		if !reflect.DeepEqual(g.End, w.end_) {
			t.Fatalf("frame %d: end\n got %+v\nwant %+v", i, g.End, w.end_)
		}
	case TypeNVML:
		if !reflect.DeepEqual(g.NVML, w.nvml) {
			t.Fatalf("frame %d: nvml\n got %+v\nwant %+v", i, g.NVML, w.nvml)
		}
	case TypePython:
		if !reflect.DeepEqual(g.Python, w.python) {
			t.Fatalf("frame %d: python\n got %+v\nwant %+v", i, g.Python, w.python)
		}
	case TypeSymbols:
		if !reflect.DeepEqual(g.Symbols, w.symbols) {
			t.Fatalf("frame %d: symbols\n got %+v\nwant %+v", i, g.Symbols, w.symbols)
		}
	default:
		t.Fatalf("frame %d: unexpected type %s", i, w.typ)
	}
}

func checkMeta(t *testing.T, got, want Meta) {
	t.Helper()
	if !got.StartWall.Equal(want.StartWall) {
		t.Fatalf("meta start %v, want %v", got.StartWall, want.StartWall)
	}
	got.StartWall = want.StartWall
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("meta\n got %+v\nwant %+v", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	s := buildSample(t)
	r, err := NewReader(bytes.NewReader(s.data))
	if err != nil {
		t.Fatal(err)
	}
	checkMeta(t, r.Meta(), s.meta)
	recs, err := readAll(r)
	if err != io.EOF {
		t.Fatalf("ended with %v, want io.EOF", err)
	}
	if len(recs) != len(s.frames) {
		t.Fatalf("%d frames, want %d", len(recs), len(s.frames))
	}
	for i := range recs {
		checkFrame(t, i, recs[i], s.frames[i])
	}
	// EOF sticks.
	for range 2 {
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("Next after EOF: %v", err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close of a NewReader: %v", err)
	}
}

// The Reader reuses its Event and Raw: a later Next must not have changed
// what an earlier copy holds, and must reset what the event does not carry.
func TestEventReuse(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	a := events.Event{Time: 1, Comm: "a", Stack: []uint64{1, 2, 3}}
	b := events.Event{Time: 2, Comm: "b", StackErr: -12}
	w.WriteEvent(events.Encode(nil, &a))
	w.WriteEvent(events.Encode(nil, &b))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := readAll(r)
	if err != io.EOF || len(recs) != 2 {
		t.Fatalf("%d frames, %v", len(recs), err)
	}
	if !eventsEqual(recs[0].Event, &a) || !eventsEqual(recs[1].Event, &b) {
		t.Fatalf("got %+v, %+v", recs[0].Event, recs[1].Event)
	}
}

// A trace may hold records of both Python frame layouts: those written
// before events.FlagPyHead (the frames end the record) and those after
// (the count before and after them, right after the frames and window).
// Each reads back with its frames, innermost first.
func TestPythonFramesBothLayouts(t *testing.T) {
	py := []events.PyFrame{{Code: 0x7f0000001000, Units: 3}, {Code: 0x7f0000002000, Units: 9, Flags: events.PyEntry}}
	old := events.Event{Time: 1, PID: 5, Comm: "py", API: events.CudaMalloc, Flags: events.FlagPython,
		Stack: []uint64{0x401000}, Py: py}
	cur := old
	cur.Time, cur.Flags, cur.Py = 2, events.FlagPython|events.FlagPyHead, py[1:]
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range []*events.Event{&old, &cur, &old} {
		if err := w.WriteEvent(events.Encode(nil, ev)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []*events.Event{&old, &cur, &old} {
		rec, err := r.Next()
		for err == nil && rec.Event == nil {
			rec, err = r.Next()
		}
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !eventsEqual(rec.Event, want) || !slices.Equal(rec.Event.Py, want.Py) {
			t.Fatalf("event %d: got %+v, want %+v", i, rec.Event, want)
		}
	}
}

// The bytes of the header and the meta frame, spelled out as
// docs/trace-format.md specifies them.
func TestWireFormat(t *testing.T) {
	// CRC-32C check value (RFC 3720 B.4): pins the polynomial the spec names.
	if c := crc32.Checksum([]byte("123456789"), castagnoli); c != 0xe3069283 {
		t.Fatalf("CRC-32C check value %#x", c)
	}
	meta := Meta{Tool: "t", StartWall: time.Unix(0, 0).UTC(), StartBoot: 5}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, meta)
	if err != nil {
		t.Fatal(err)
	}
	ev := events.Event{Time: 0x0102030405060708, Comm: "c", Stack: []uint64{0xaa}}
	raw := events.Encode(nil, &ev)
	if err := w.WriteEvent(raw); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	js := `{"tool":"t","host":"","kernel":"","start":"1970-01-01T00:00:00Z","boot_ns":5}`
	want := []byte("\x89CUDATRC\x01\x00\x00\x00")
	want = appendFrame(want, 1, []byte(js))
	want = appendFrame(want, 3, raw)
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("wrote\n%q\nwant\n%q", buf.Bytes(), want)
	}
	// The example frame in docs/trace-format.md.
	buf.Reset()
	if err := w.WriteEnd(&End{Time: 5}); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	doc := "18 00 00 00 06 7b 22 62 6f 6f 74 5f 6e 73 22 3a 35 2c 22 65 76 65 6e 74 73 22 3a 30 7d 0b 3f 76 3e"
	if got := fmt.Sprintf("% x", buf.Bytes()); got != doc {
		t.Fatalf("end frame\n%s\nwant\n%s", got, doc)
	}
	if len(raw) != 80 || raw[0] != 0x08 || raw[7] != 0x01 || raw[52] != 1 || raw[56] != 'c' || raw[57] != 0 || raw[72] != 0xaa {
		t.Fatalf("event record % x", raw)
	}
}

// TestWireFormatEveryFit writes frames of every type and many sizes, some
// past the buffer's end and some larger than the buffer, so that each
// lands where the buffer has room for it whole (one Write) and where it
// has not (three), and checks the bytes against appendFrame's.
func TestWireFormatEveryFit(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), buf.Bytes()...)
	for i := range 5000 {
		n := (i * 37) % 301
		if i%997 == 0 {
			n = 300<<10 + i // larger than the buffer
		}
		payload := make([]byte, n)
		for j := range payload {
			payload[j] = byte(i + j)
		}
		typ := Type(1 + i%int(lastType))
		if err := w.frame(typ, payload); err != nil {
			t.Fatal(err)
		}
		want = appendFrame(want, byte(typ), payload)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		i := 0
		for i < min(buf.Len(), len(want)) && buf.Bytes()[i] == want[i] {
			i++
		}
		t.Fatalf("wrote %d bytes, want %d: first difference at byte %d", buf.Len(), len(want), i)
	}
}

// appendFrame encodes a frame independently of the Writer.
func appendFrame(dst []byte, typ byte, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, typ)
	dst = append(dst, payload...)
	crc := crc32.Checksum(append([]byte{typ}, payload...), crc32.MakeTable(crc32.Castagnoli))
	return binary.LittleEndian.AppendUint32(dst, crc)
}

func header(version uint16) []byte {
	h := []byte(Magic)
	h = binary.LittleEndian.AppendUint16(h, version)
	return binary.LittleEndian.AppendUint16(h, 0)
}

func metaFrame(t testing.TB) []byte {
	b, err := json.Marshal(testMeta())
	if err != nil {
		t.Fatal(err)
	}
	return appendFrame(nil, byte(TypeMeta), b)
}

func TestMetaWallTime(t *testing.T) {
	m := testMeta()
	s := buildSample(t)
	r, err := NewReader(bytes.NewReader(s.data))
	if err != nil {
		t.Fatal(err)
	}
	rm := r.Meta()
	for _, c := range []struct {
		boot uint64
		want time.Time
	}{
		{m.StartBoot, m.StartWall},
		{m.StartBoot + 1, m.StartWall.Add(1)},
		{m.StartBoot + 90*uint64(time.Minute) + 7, m.StartWall.Add(90*time.Minute + 7)},
		{m.StartBoot - 1_500_000_000, m.StartWall.Add(-1500 * time.Millisecond)}, // before the start
		{0, m.StartWall.Add(-time.Duration(m.StartBoot))},
	} {
		for _, mm := range []*Meta{&m, &rm} {
			if got := mm.WallTime(c.boot); !got.Equal(c.want) {
				t.Errorf("WallTime(%d) = %v, want %v", c.boot, got, c.want)
			}
		}
	}
	if got, want := rm.WallTime(1_234_567_890_123+2_464_102_068), time.Date(2025, 3, 14, 15, 9, 29, 0, time.UTC); !got.Equal(want) {
		t.Errorf("WallTime = %v, want %v", got, want)
	}
}

// Cut the file at every length: a reader keeps every frame complete before
// the cut and then says the file is truncated (or ends cleanly, where the
// cut falls between frames).
func TestTruncatedAtEveryLength(t *testing.T) {
	s := buildSample(t)
	ends := map[int]bool{}
	for _, f := range s.frames {
		ends[f.end] = true
	}
	for cut := 0; cut < len(s.data); cut++ {
		r, err := NewReader(bytes.NewReader(s.data[:cut]))
		switch {
		case cut < len(Magic):
			if r != nil || !errors.Is(err, ErrNotTrace) {
				t.Fatalf("cut %d: NewReader = %v, %v; want ErrNotTrace", cut, r, err)
			}
			continue
		case cut < s.metaEnd:
			if r != nil || !errors.Is(err, ErrTruncated) {
				t.Fatalf("cut %d: NewReader = %v, %v; want ErrTruncated", cut, r, err)
			}
			continue
		case err != nil:
			t.Fatalf("cut %d: NewReader: %v", cut, err)
		}
		checkMeta(t, r.Meta(), s.meta)
		recs, err := readAll(r)
		n := 0
		for n < len(s.frames) && s.frames[n].end <= cut {
			n++
		}
		if len(recs) != n {
			t.Fatalf("cut %d: %d frames, want %d (then %v)", cut, len(recs), n, err)
		}
		for i := range recs {
			checkFrame(t, i, recs[i], s.frames[i])
		}
		if cut == s.metaEnd || ends[cut] {
			if err != io.EOF {
				t.Fatalf("cut %d between frames: %v, want io.EOF", cut, err)
			}
		} else if !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut %d: %v, want ErrTruncated", cut, err)
		}
		if _, again := r.Next(); again != err {
			t.Fatalf("cut %d: error did not stick: %v then %v", cut, err, again)
		}
	}
}

// Damage every byte after the header in turn: the frames before the damaged
// one come back intact, then an error; never a damaged frame.
func TestCorruptEveryByte(t *testing.T) {
	s := buildSample(t)
	all := append([]want{{typ: TypeMeta, off: headerSize, end: s.metaEnd}}, s.frames...)
	data := slices.Clone(s.data)
	for pos := headerSize; pos < len(data); pos++ {
		k := 0 // damaged frame, in all
		for all[k].end <= pos {
			k++
		}
		inLength := pos < all[k].off+4
		data[pos] ^= 0x5a
		r, err := NewReader(bytes.NewReader(data))
		var recs []got
		if err == nil {
			checkMeta(t, r.Meta(), s.meta)
			recs, err = readAll(r)
		} else if k != 0 {
			t.Fatalf("byte %d: NewReader: %v", pos, err)
		}
		data[pos] ^= 0x5a
		if len(recs) != max(k-1, 0) {
			t.Fatalf("byte %d (frame %d): read %d frames, then %v", pos, k, len(recs), err)
		}
		for i := range recs {
			checkFrame(t, i, recs[i], s.frames[i])
		}
		if !errors.Is(err, ErrCorrupt) && !(inLength && errors.Is(err, ErrTruncated)) {
			t.Fatalf("byte %d (frame %d, length field %v): %v, want ErrCorrupt", pos, k, inLength, err)
		}
		if !inLength && !strings.Contains(err.Error(), fmt.Sprintf("offset %d", all[k].off)) {
			t.Fatalf("byte %d: error %q does not give the frame's offset %d", pos, err, all[k].off)
		}
	}
}

func TestAbsurdLength(t *testing.T) {
	for _, size := range []uint32{MaxFrame + 1, 1 << 30, math.MaxUint32} {
		data := append(header(Version), metaFrame(t)...)
		data = binary.LittleEndian.AppendUint32(data, size)
		data = append(data, byte(TypeEvent))
		data = append(data, make([]byte, 100)...)
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err = r.Next()
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("length %d: %v, want ErrCorrupt", size, err)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 64<<10 {
			t.Fatalf("length %d: allocated %d bytes", size, n)
		}
	}
	// At the limit the length is plausible: a file that stops short of it
	// is truncated, not corrupt.
	data := append(header(Version), metaFrame(t)...)
	data = binary.LittleEndian.AppendUint32(data, MaxFrame)
	data = append(data, byte(TypeEvent), 1, 2, 3)
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, ErrTruncated) {
		t.Fatalf("length MaxFrame: %v, want ErrTruncated", err)
	}
}

func TestNotTrace(t *testing.T) {
	for _, data := range [][]byte{
		nil,
		[]byte("\x89CUDA"),
		[]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"),
		[]byte("\x89CUDATRc\x01\x00\x00\x00"),
		[]byte("{\"tool\":\"cudatrace\"}\n"),
		append([]byte("\x89CUDATRC\x01\x00\x00\x00")[1:], metaFrame(t)...),
	} {
		r, err := NewReader(bytes.NewReader(data))
		if r != nil || !errors.Is(err, ErrNotTrace) {
			t.Errorf("%q: %v, %v; want ErrNotTrace", data, r, err)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, v := range []uint16{0, 2, 0x100, math.MaxUint16} {
		data := append(header(v), metaFrame(t)...)
		r, err := NewReader(bytes.NewReader(data))
		if r != nil || !errors.Is(err, ErrVersion) {
			t.Errorf("version %d: %v, %v; want ErrVersion", v, r, err)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("version %d", v)) {
			t.Errorf("version %d: error %q does not say which", v, err)
		}
	}
	// The flags field is reserved: version 1 readers ignore it.
	data := append(header(Version), metaFrame(t)...)
	data[len(Magic)+2] = 0xff
	if _, err := NewReader(bytes.NewReader(data)); err != nil {
		t.Errorf("flags set: %v", err)
	}
}

func TestUnknownFrameTypesSkipped(t *testing.T) {
	ev := events.Event{Time: 77, PID: 1, Comm: "a", API: events.CudaMalloc, Stack: []uint64{1, 2}}
	raw := events.Encode(nil, &ev)
	end, _ := json.Marshal(End{Time: 99, Events: 2})
	data := append(header(Version), metaFrame(t)...)
	data = appendFrame(data, 0, []byte("zero"))
	off1 := len(data)
	data = appendFrame(data, byte(TypeEvent), raw)
	data = appendFrame(data, 10, nil)
	data = appendFrame(data, 200, bytes.Repeat([]byte{0xee}, 5000))
	data = appendFrame(data, 255, []byte("{not json"))
	off2 := len(data)
	data = appendFrame(data, byte(TypeEvent), raw)
	off3 := len(data)
	data = appendFrame(data, byte(TypeEnd), end)
	data = appendFrame(data, 11, []byte("after the end"))
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := readAll(r)
	if err != io.EOF {
		t.Fatalf("ended with %v", err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d frames, want 3", len(recs))
	}
	for i, off := range []int{off1, off2, off3} {
		if recs[i].Offset != int64(off) {
			t.Errorf("frame %d at %d, want %d", i, recs[i].Offset, off)
		}
	}
	if !eventsEqual(recs[0].Event, &ev) || !eventsEqual(recs[1].Event, &ev) || recs[2].End.Events != 2 {
		t.Fatalf("got %+v", recs)
	}
	// An unknown frame that is damaged is still damage.
	data = append(header(Version), metaFrame(t)...)
	bad := appendFrame(nil, 200, []byte("payload"))
	bad[7] ^= 1
	data = append(data, bad...)
	r, err = NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged unknown frame: %v, want ErrCorrupt", err)
	}
}

// Frames whose checksum is right but whose content is not.
func TestBadContent(t *testing.T) {
	okEvent := events.Encode(nil, &events.Event{Stack: []uint64{1}})
	for _, c := range []struct {
		name string
		typ  Type
		body []byte
	}{
		{"short event", TypeEvent, okEvent[:71]},
		{"empty event", TypeEvent, nil},
		{"event missing frames", TypeEvent, okEvent[:79]},
		{"process not json", TypeProcess, []byte("{")},
		{"attach wrong type", TypeAttach, []byte(`{"library":7}`)},
		{"nvml wrong type", TypeNVML, []byte(`{"devices":7}`)},
		{"counters empty", TypeCounters, nil},
		{"end array", TypeEnd, []byte(`[]`)},
		{"second meta not json", TypeMeta, []byte("nope")},
	} {
		data := append(header(Version), metaFrame(t)...)
		off := len(data)
		data = appendFrame(data, byte(c.typ), c.body)
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Next()
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", off)) {
			t.Errorf("%s: %v, want ErrCorrupt at offset %d", c.name, err, off)
		}
	}
	// The first frame must be the meta frame.
	data := append(header(Version), appendFrame(nil, byte(TypeEvent), okEvent)...)
	if r, err := NewReader(bytes.NewReader(data)); r != nil || !errors.Is(err, ErrCorrupt) {
		t.Errorf("no meta frame first: %v, %v; want ErrCorrupt", r, err)
	}
	data = append(header(Version), appendFrame(nil, byte(TypeMeta), []byte("{"))...)
	if r, err := NewReader(bytes.NewReader(data)); r != nil || !errors.Is(err, ErrCorrupt) {
		t.Errorf("meta not json: %v, %v; want ErrCorrupt", r, err)
	}
	// Unknown JSON fields are a later writer's additions, not damage.
	data = append(header(Version), appendFrame(nil, byte(TypeMeta), []byte(`{"tool":"x","gpu":"H100"}`))...)
	data = appendFrame(data, byte(TypeEnd), []byte(`{"boot_ns":1,"events":0,"why":{"nested":[1]}}`))
	r, err := NewReader(bytes.NewReader(data))
	if err != nil || r.Meta().Tool != "x" {
		t.Fatalf("unknown meta field: %v", err)
	}
	if rec, err := r.Next(); err != nil || rec.End == nil || rec.End.Time != 1 {
		t.Fatalf("unknown end field: %+v, %v", rec, err)
	}
}

var errDiskFull = errors.New("no space left on device")

// failWriter takes n bytes, then fails every write.
type failWriter struct {
	n      int
	buf    bytes.Buffer
	writes int // calls after the first failure
	failed bool
}

func (f *failWriter) Write(p []byte) (int, error) {
	if f.failed {
		f.writes++
		return 0, errDiskFull
	}
	if room := f.n - f.buf.Len(); len(p) > room {
		f.buf.Write(p[:room])
		f.failed = true
		return room, errDiskFull
	}
	return f.buf.Write(p)
}

func TestWriteErrorSticks(t *testing.T) {
	if w, err := NewWriter(&failWriter{n: 10}, testMeta()); w != nil || !errors.Is(err, errDiskFull) {
		t.Fatalf("NewWriter on a full disk: %v, %v", w, err)
	}
	s := buildSample(t)
	fw := &failWriter{n: s.metaEnd + 1000}
	w, err := NewWriter(fw, s.meta)
	if err != nil {
		t.Fatal(err)
	}
	ev := events.Event{Time: 1, Comm: "a", Stack: make([]uint64, 20)}
	raw := events.Encode(nil, &ev)
	for range 10 {
		if err := w.WriteEvent(raw); err != nil {
			t.Fatalf("buffered write failed: %v", err)
		}
	}
	err = w.Flush()
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("Flush: %v, want the disk's error", err)
	}
	for name, f := range map[string]func() error{
		"WriteEvent":    func() error { return w.WriteEvent(raw) },
		"WriteProcess":  func() error { return w.WriteProcess(&Process{PID: 1}) },
		"WriteAttach":   func() error { return w.WriteAttach(&Attach{Library: "x"}) },
		"WriteCounters": func() error { return w.WriteCounters(&Counters{}) },
		"WriteEnd":      func() error { return w.WriteEnd(&End{}) },
		"Flush":         w.Flush,
		"Close":         w.Close,
	} {
		if got := f(); got != err {
			t.Errorf("%s after the failure: %v, want %v", name, got, err)
		}
	}
	if fw.writes != 0 {
		t.Errorf("%d writes after the failure", fw.writes)
	}
	// What reached the disk is a truncated trace, readable up to the cut.
	r, err := NewReader(bytes.NewReader(fw.buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := readAll(r)
	if !errors.Is(err, ErrTruncated) || len(recs) != 1000/(len(raw)+9) {
		t.Fatalf("%d frames, then %v", len(recs), err)
	}

	// Without Flush, the error surfaces once the buffer spills.
	fw = &failWriter{n: s.metaEnd + 1000}
	w, err = NewWriter(fw, s.meta)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; n < 10000; n++ {
		if err = w.WriteEvent(raw); err != nil {
			break
		}
	}
	if !errors.Is(err, errDiskFull) || n > (256<<10)/(len(raw)+9)+1 {
		t.Fatalf("after %d events: %v", n, err)
	}
	if again := w.WriteEvent(raw); again != err {
		t.Fatalf("error did not stick: %v", again)
	}
}

func TestOversizedFrame(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	before := buf.Len()
	if err := w.WriteEvent(make([]byte, MaxFrame+1)); err == nil {
		t.Fatal("frame over MaxFrame written")
	}
	// Refused, not failed: nothing written, the writer carries on.
	ev := events.Encode(nil, &events.Event{Time: 5})
	if err := w.WriteEvent(ev); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != before+len(ev)+9 {
		t.Fatalf("wrote %d bytes, want %d", buf.Len()-before, len(ev)+9)
	}
}

func TestCreateOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.trace")
	s := buildSample(t)
	w, err := Create(path, s.meta)
	if err != nil {
		t.Fatal(err)
	}
	// The header and meta frame are on disk at once.
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, s.data[:s.metaEnd]) {
		t.Fatalf("after Create the file holds %d bytes (%v), want %d", len(b), err, s.metaEnd)
	}
	procs, atts, evs := sampleProcesses(), sampleAttaches(), sampleEvents()
	w.WriteAttach(atts[0])
	w.WriteAttach(atts[1])
	w.WriteProcess(procs[0])
	for i := range evs {
		w.WriteEvent(events.Encode(nil, &evs[i]))
	}
	w.WriteEnd(&End{Time: 9, Events: uint64(len(evs))})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	checkMeta(t, r.Meta(), s.meta)
	recs, err := readAll(r)
	if err != io.EOF || len(recs) != 3+len(evs)+1 {
		t.Fatalf("%d frames, then %v", len(recs), err)
	}
	if !reflect.DeepEqual(recs[2].Process, procs[0]) || !reflect.DeepEqual(recs[1].Attach, atts[1]) {
		t.Fatalf("got %+v %+v", recs[2].Process, recs[1].Attach)
	}
	for i := range evs {
		if !eventsEqual(recs[3+i].Event, &evs[i]) {
			t.Fatalf("event %d: got %+v want %+v", i, recs[3+i].Event, evs[i])
		}
	}
	if recs[len(recs)-1].End.Events != uint64(len(evs)) {
		t.Fatalf("end %+v", recs[len(recs)-1].End)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	// Create truncates.
	w, err = Create(path, s.meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != int64(s.metaEnd) {
		t.Fatalf("recreated file: %v, %v", fi, err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.trace")
	if r, err := Open(missing); r != nil || err == nil || !strings.Contains(err.Error(), missing) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Open of a missing file: %v, %v", r, err)
	}
	text := filepath.Join(dir, "notes.txt")
	os.WriteFile(text, []byte("hello, this is not a trace\n"), 0o644)
	if r, err := Open(text); r != nil || !errors.Is(err, ErrNotTrace) || !strings.Contains(err.Error(), text) {
		t.Errorf("Open of a text file: %v, %v", r, err)
	}
	s := buildSample(t)
	cut := filepath.Join(dir, "cut.trace")
	os.WriteFile(cut, s.data[:s.metaEnd-1], 0o644)
	if r, err := Open(cut); r != nil || !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), cut) {
		t.Errorf("Open of a file cut in its meta frame: %v, %v", r, err)
	}
	bad := filepath.Join(dir, "no-such-dir", "x.trace")
	if w, err := Create(bad, testMeta()); w != nil || err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Create in a missing directory: %v, %v", w, err)
	}
}

func TestTypeString(t *testing.T) {
	for typ, want := range map[Type]string{TypeMeta: "meta", TypeProcess: "process", TypeEvent: "event",
		TypeCounters: "counters", TypeAttach: "attach", TypeEnd: "end", TypeNVML: "nvml", TypePython: "python", TypeSymbols: "symbols", 0: "unknown", 10: "unknown", 255: "unknown"} {
		if got := typ.String(); got != want {
			t.Errorf("Type(%d) = %q, want %q", typ, got, want)
		}
	}
}
