package replay

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

const base = 1_000_000

func alloc(tm uint64, pid uint32, addr, size uint64, stack ...uint64) events.Event {
	return events.Event{Time: base + tm, Duration: 10, PID: pid, TID: pid, Comm: "w", API: events.CudaMalloc,
		Addr: addr, Size: size, Stack: stack}
}

func free(tm uint64, pid uint32, addr uint64) events.Event {
	return events.Event{Time: base + tm, PID: pid, TID: pid, Comm: "w", API: events.CudaFree, Addr: addr,
		Flags: events.FlagEntryOnly}
}

func maps(path string) []tracefile.Mapping {
	return []tracefile.Mapping{{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: path}}
}

func items() []any {
	return []any{
		alloc(100, 2, 0xa0, 5, 0x1100), // before pid 2's capture
		&tracefile.Process{PID: 1, Comm: "w", Cmdline: []string{"first"}, Time: base + 150, Maps: maps("/one")},
		alloc(200, 1, 0xb0, 100, 0x1200),
		&tracefile.Process{PID: 2, Comm: "w", Time: base + 250, Maps: maps("/two")},
		&tracefile.Process{PID: 1, Comm: "w", Cmdline: []string{"second"}, Time: base + 260, Maps: maps("/three")},
		alloc(300, 1, 0xc0, 50, 0x1200), // the same stack: keeps /one
		alloc(310, 1, 0xd0, 7, 0x1300),  // a new stack: /three
		free(400, 1, 0xb0),
		// Written after the free but effective before it (another CPU).
		alloc(350, 1, 0xe0, 1, 0x1400),
		&tracefile.Counters{Time: base + 450, Counters: map[string]uint64{"events": 6}, Lost: 3},
		&tracefile.End{Time: base + 500},
	}
}

func TestRead(t *testing.T) {
	path, _ := tracetest.Write(t, tracefile.Meta{StartBoot: base}, items()...)
	var seen []uint64
	tr, err := Read(path, Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		seen = append(seen, ev.Addr)
		if ch.Process == nil || ch.Process.PID != ev.PID {
			t.Errorf("event %#x: change %+v", ev.Addr, ch)
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Warning != "" || tr.End == nil || tr.Events != 6 || tr.Lost != 3 || tr.Last != base+500 ||
		tr.DurationNS() != 500 || tr.Counters["events"] != 6 {
		t.Errorf("trace %+v", tr)
	}
	if want := []uint64{0xa0, 0xb0, 0xc0, 0xd0, 0xb0, 0xe0}; !slices.Equal(seen, want) {
		t.Errorf("OnEvent saw %#x, want %#x", seen, want)
	}
	if tr.First(1).Cmdline[0] != "first" || tr.Latest(1).Cmdline[0] != "second" {
		t.Errorf("captures: first %+v latest %+v", tr.First(1), tr.Latest(1))
	}
	for _, c := range []struct {
		pid   uint32
		frame uint64
		want  string
	}{{2, 0x1100, "/two"}, {1, 0x1200, "/one"}, {1, 0x1300, "/three"}} {
		st := tr.Ledger.StackOf(c.pid, []uint64{c.frame}, false)
		if m := tr.Maps(st); len(m) != 1 || m[0].Path != c.want {
			t.Errorf("stack %#x of pid %d: maps %+v, want %s", c.frame, c.pid, m, c.want)
		}
	}

	syms := tr.Symbols(false)
	defer syms.Close()
	st := tr.Ledger.StackOf(1, []uint64{0x1200}, false)
	if f := syms.Frames(st); len(f) != 1 || f[0].Addr != 0x1200 || f[0].Function != "" {
		t.Errorf("unsymbolized frames %+v", f)
	}
	if f := syms.Frames(nil); f == nil || len(f) != 0 {
		t.Errorf("frames of no stack: %#v", f)
	}
}

// Until stops the ledger at a moment: events that took effect later are
// left out even when they were written before ones that count.
func TestReadUntil(t *testing.T) {
	path, _ := tracetest.Write(t, tracefile.Meta{StartBoot: base}, items()...)
	tr, err := Read(path, Options{Until: base + 360})
	if err != nil {
		t.Fatal(err)
	}
	p := tr.Ledger.Process(1)
	// 0xb0 (100), 0xc0 (50), 0xd0 (7), 0xe0 (1) live; the free at 400 not yet.
	if p.Live != 158 || p.Frees != 0 || tr.Events != 5 {
		t.Errorf("live %d frees %d events %d, want 158, 0, 5", p.Live, p.Frees, tr.Events)
	}
}

func TestReadErrors(t *testing.T) {
	path, ends := tracetest.Write(t, tracefile.Meta{StartBoot: base}, items()...)
	stop := errors.New("enough")
	n := 0
	_, err := Read(path, Options{OnEvent: func(*events.Event, ledger.Change) error {
		if n++; n == 2 {
			return stop
		}
		return nil
	}})
	if !errors.Is(err, stop) || n != 2 {
		t.Errorf("OnEvent's error: %v after %d events", err, n)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.trace")
	if err := os.WriteFile(cut, data[:ends[5]-2], 0o644); err != nil { // inside the 0xc0 allocation
		t.Fatal(err)
	}
	tr, err := Read(cut, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tr.Warning, "trace truncated") || tr.Events != 2 {
		t.Errorf("cut trace: warning %q, %d events", tr.Warning, tr.Events)
	}
	whole := filepath.Join(dir, "noend.trace")
	if err := os.WriteFile(whole, data[:ends[9]], 0o644); err != nil { // up to the counters
		t.Fatal(err)
	}
	if tr, err = Read(whole, Options{}); err != nil || !strings.Contains(tr.Warning, "no end record") || tr.Events != 6 {
		t.Errorf("trace without its end: %v, %+v", err, tr)
	}
	if _, err := Read(filepath.Join(dir, "absent"), Options{}); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("missing file: %v", err)
	}
}

// A sample waits for the first event that took effect after it; with none
// for longer than maxWaitingSamples samples, the oldest go with the ledger
// as it stands; the rest go at the file's end.
func TestNVMLInTimeOrder(t *testing.T) {
	sample := func(at uint64) *tracefile.NVML { return &tracefile.NVML{Time: base + at} }
	in := []any{
		alloc(100, 1, 0xa0, 10),
		sample(200), // written before a record that took effect before it
		alloc(150, 1, 0xb0, 20),
		alloc(250, 1, 0xc0, 40),
	}
	for i := range maxWaitingSamples + 2 { // at 300 ... 365
		in = append(in, sample(300+uint64(i)))
	}
	// Before them all, written after them: the two oldest have gone by
	// then, without it; the others see it.
	in = append(in, free(290, 1, 0xa0))
	path, _ := tracetest.Write(t, tracefile.Meta{StartBoot: base}, in...)
	var at, live []uint64 // each sample's time and the live bytes beside it, in the order handed over
	tr, err := Read(path, Options{OnNVML: func(n *tracefile.NVML, l *ledger.Ledger) error {
		at = append(at, n.Time-base)
		live = append(live, l.Process(1).Live)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	wantAt, wantLive := []uint64{200}, []uint64{30}
	for i := range uint64(maxWaitingSamples + 2) {
		wantAt = append(wantAt, 300+i)
		wantLive = append(wantLive, map[bool]uint64{true: 70, false: 60}[i < 2])
	}
	if tr.Events != 4 || !slices.Equal(at, wantAt) || !slices.Equal(live, wantLive) {
		t.Errorf("events %d; samples at %v\nwant %v\nlive beside them %v\nwant %v", tr.Events, at, wantAt, live, wantLive)
	}
}
