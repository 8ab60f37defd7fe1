package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// pyEvent applies ev as record's session does for a CPython process: the
// ledger gets the stack with t's Python frames merged in, the observer the
// record as captured.
func (s *session) pyEvent(t *pystack.Table, ev events.Event) {
	s.run(func() {
		native := ev.Stack
		if st, ok := t.Stack(nil, &ev); ok {
			ev.Stack = st
		}
		ch := s.ledger.Apply(&ev)
		ev.Stack = native
		s.a.Event(&ev, ch)
	})
}

// TestPythonFrames: one native stack, three Python lines. The profile,
// the snapshot, the OOM dump and a trace window name each line, and the
// allocations of two lines stay two samples with their own bytes.
func TestPythonFrames(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir})
	pid := uint32(os.Getpid())
	s.process(pid, "python3")
	tb := pystack.NewTable([][2]uint64{{0x5000, 0x6000}})
	tb.Minor = 12
	const file = "/app/train.py"
	lines := map[int32]int{4: 12, 9: 14, 20: 31} // units -> line
	fn := map[int32]string{4: "Model.forward", 9: "Model.forward", 20: "grow"}
	s.run(func() {
		s.a.Python(pid, tb)
		for _, u := range []int32{4, 9} { // 20 is resolved as the session would, later
			tb.Put(pystack.Code{Code: 0xc0de, Units: u, File: file, Function: fn[u], Line: lines[u]})
		}
	})
	ev := func(units int32, addr, size uint64, result int32) events.Event {
		return events.Event{PID: pid, TID: 7, Comm: "python3", API: events.CudaMalloc, Addr: addr, Size: size,
			Result: result, Flags: events.FlagPython, Stack: []uint64{0x1000, 0x5010, 0x3000},
			Py: []events.PyFrame{{Code: 0xc0de, Units: units, Flags: events.PyEntry}}}
	}
	s.pyEvent(tb, ev(4, 0x10000, 100, 0))
	s.pyEvent(tb, ev(9, 0x20000, 50, 0))
	s.pyEvent(tb, ev(4, 0x30000, 1000, 0))

	// The trace window opens before the failure: it carries the Python
	// records replay needs.
	var trace bytes.Buffer
	errc := make(chan error, 1)
	go func() { errc <- s.a.Trace(ctx(t), &trace, pid, 500*time.Millisecond) }()
	time.Sleep(200 * time.Millisecond) // subscribed
	s.run(func() {
		tb.Put(pystack.Code{Code: 0xc0de, Units: 20, File: file, Function: fn[20], Line: lines[20]})
	})
	s.pyEvent(tb, ev(20, 0, 1<<40, 2))
	s.pyEvent(tb, ev(9, 0x40000, 8, 0))

	// pprof: the Python frame is a function with file and line, in place
	// of the interpreter loop's address.
	var buf bytes.Buffer
	if err := s.a.Profile(ctx(t), &buf, pid); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]int64{}
	for _, smp := range p.Sample {
		if len(smp.Location) != 3 || smp.Location[0].Address != 0x1000 || smp.Location[2].Address != 0x3000 ||
			len(smp.Location[1].Line) != 1 {
			t.Fatalf("sample locations %+v", smp.Location)
		}
		l := smp.Location[1].Line[0]
		got[fmt.Sprintf("%s:%d:%s", l.Function.Filename, l.Line, l.Function.Name)] = smp.Value
	}
	want := map[string][]int64{
		"/app/train.py:12:Model.forward": {2, 1100, 2, 1100},
		"/app/train.py:14:Model.forward": {2, 58, 2, 58},
		"/app/train.py:31:grow":          nil, // a failure: no sample
	}
	if len(got) != 2 || !equal(got["/app/train.py:12:Model.forward"], want["/app/train.py:12:Model.forward"]...) ||
		!equal(got["/app/train.py:14:Model.forward"], want["/app/train.py:14:Model.forward"]...) {
		t.Fatalf("samples by Python line %v, want %v", got, want)
	}

	// The OOM dump names the failing line.
	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*"))
	}
	if len(files) != 3 {
		t.Fatalf("dump files %v, want 3", files)
	}
	for _, f := range files {
		data, _ := os.ReadFile(f)
		switch filepath.Ext(f) {
		case ".json":
			var rep OOMReport
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatal(err)
			}
			fr := rep.Failure.Frames
			if len(fr) != 3 || fr[1].Function != "grow" || fr[1].File != file || fr[1].Line != 31 ||
				fr[1].Module != pystack.Module || fr[0].Address != "0x1000" {
				t.Errorf("failing stack %+v, want grow at %s:31 second", fr, file)
			}
			if ls := rep.Failure.LiveStacks; len(ls) != 2 || ls[0].LiveBytes != 1100 || ls[0].Frames[1].Line != 12 ||
				ls[1].LiveBytes != 50 || ls[1].Frames[1].Line != 14 {
				t.Errorf("live stacks %+v, want line 12 with 1100 B, line 14 with 50 B", ls)
			}
		case ".pickle":
			// The process's history (the flight recorder's) ends with the
			// failure's oom entry, with frames as memory_viz reads them.
			if py, err := exec.LookPath("python3"); err == nil {
				out, err := exec.Command(py, "-c", `import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
for e in d["device_traces"][0]:
    print(e["action"], e["size"], [(f["filename"], f["line"], f["name"]) for f in e["frames"]][1])
for s in d["segments"]:
    print(s["total_size"], [(f["filename"], f["line"], f["name"]) for f in s["frames"]][1])`, f).CombinedOutput()
				wantOut := "segment_alloc 100 ('/app/train.py', 12, 'Model.forward')\n" +
					"alloc 100 ('/app/train.py', 12, 'Model.forward')\n" +
					"segment_alloc 50 ('/app/train.py', 14, 'Model.forward')\n" +
					"alloc 50 ('/app/train.py', 14, 'Model.forward')\n" +
					"segment_alloc 1000 ('/app/train.py', 12, 'Model.forward')\n" +
					"alloc 1000 ('/app/train.py', 12, 'Model.forward')\n" +
					"oom 1099511627776 ('/app/train.py', 31, 'grow')\n" +
					"100 ('/app/train.py', 12, 'Model.forward')\n" +
					"50 ('/app/train.py', 14, 'Model.forward')\n" +
					"1000 ('/app/train.py', 12, 'Model.forward')\n"
				if err != nil || string(out) != wantOut {
					t.Errorf("memviz pickle: %v\n%s\nwant\n%s", err, out, wantOut)
				}
			} else if !bytes.Contains(data, []byte("grow")) || !bytes.Contains(data, []byte(file)) {
				t.Errorf("memviz pickle names no %s:grow", file)
			}
		}
	}

	// The trace window replays with the same Python frames.
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	// Its first python frame says what the recorder's does: the
	// interpreter's minor version and its loop's ranges.
	var pys []*tracefile.Python
	path := readWindow(t, trace.Bytes(), func(rec tracefile.Record) {
		if rec.Type == tracefile.TypePython {
			pys = append(pys, rec.Python)
		}
	})
	// The window starts with the live set: the first python frame also
	// names the two frames its stacks need, the second the one new since.
	if len(pys) != 2 || pys[0].PID != pid || pys[0].Minor != 12 || len(pys[0].Eval) != 1 || pys[0].Eval[0] != [2]uint64{0x5000, 0x6000} ||
		len(pys[0].Codes) != 2 || len(pys[1].Codes) != 1 {
		t.Errorf("python frames of the window: %+v", pys)
	}
	tr, err := replay.Read(path, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	syms := tr.Symbols(false)
	defer syms.Close()
	var seen []string
	for _, st := range tr.Ledger.Stacks() {
		f := syms.Frames(st)
		if len(f) != 3 {
			t.Fatalf("replayed stack %+v", f)
		}
		seen = append(seen, fmt.Sprintf("%s:%d:%s %d %d", f[1].File, f[1].Line, f[1].Function, st.AllocBytes, st.Live))
	}
	// Allocated in the window: 8 bytes at line 14; live: what the agent
	// held when it opened (1100 bytes from line 12, 50 from line 14) and
	// those 8.
	slices.Sort(seen)
	if got := strings.Join(seen, "\n"); got != "/app/train.py:12:Model.forward 0 1100\n/app/train.py:14:Model.forward 8 58\n/app/train.py:31:grow 0 0" {
		t.Errorf("replayed window's stacks:\n%s", got)
	}
}
