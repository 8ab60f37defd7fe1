package record

import (
	"bytes"
	"io"
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// namerSetup returns a session writing to a buffer, this process as one
// with its own root (read through /proc/self's PID/root, as a
// container's), and a return address in one of its libraries with a GNU
// build ID that the symbolizer names, with that name.
func namerSetup(t testing.TB) (*session, *bytes.Buffer, *liveProc, uint64, symbolize.Frame, proc.Mapping) {
	t.Helper()
	pid := os.Getpid()
	all, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	var maps []proc.Mapping
	for _, m := range all {
		if m.Exec() && m.File() {
			m.BuildID, _ = symbolize.BuildID(m.Path)
			maps = append(maps, m)
		}
	}
	start, err := proc.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	ref := symbolize.New()
	var pc uint64
	var want symbolize.Frame
	var in proc.Mapping
	for _, m := range maps {
		if m.BuildID == "" {
			continue
		}
		for _, frac := range []uint64{2, 3, 5, 7} {
			a := m.Start + (m.End-m.Start)/frac
			if f := ref.FramesOf(symbolize.Proc{}, maps, []uint64{a})[0]; f.Function != "" {
				pc, want, in = a, f, m
				break
			}
		}
		if pc != 0 {
			break
		}
	}
	if pc == 0 {
		t.Fatalf("no address in a mapping with a build ID that symbolizes: %+v", maps)
	}
	var trace bytes.Buffer
	w, err := NewTraceWriter(&trace, tracefile.Meta{Tool: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s := newState(Options{Stderr: io.Discard}, nil)
	s.w = w
	t.Cleanup(func() {
		if s.namer != nil {
			s.namer.stop()
		}
	})
	ps := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: uint32(pid), Start: start, OwnRoot: true, Maps: maps})}
	return s, &trace, ps, pc, want, in
}

// TestNameNative: the return addresses of a process with its own root
// are named from its files into the trace, each (build ID, offset) once,
// as the symbolizer names them.
func TestNameNative(t *testing.T) {
	s, trace, ps, pc, want, m := namerSetup(t)
	ev := &events.Event{PID: uint32(os.Getpid()), Stack: []uint64{pc, pc, 1}}
	s.nameNative(ev, ps)
	s.nameNative(ev, ps)
	s.writeNamed(true)
	if err := s.w.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := tracefile.NewReader(bytes.NewReader(trace.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var got []tracefile.Symbol
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type == tracefile.TypeSymbols {
			got = append(got, rec.Symbols.Frames...)
		}
	}
	exp := tracefile.Symbol{BuildID: m.BuildID, Offset: pc - m.Start + m.Offset, VAddr: want.Offset,
		Function: want.Function, File: want.File, Line: want.Line}
	if len(got) != 1 || got[0] != exp {
		t.Fatalf("symbols frames hold %+v, want exactly %+v", got, exp)
	}
	// A process that sees the tracer's files is left to report.
	s2, trace2, ps2, pc2, _, _ := namerSetup(t)
	ps2.p = s2.procs.Add(&procmodel.Capture{PID: 1, Start: ps2.p.Current().Start, Maps: ps2.p.Current().Maps})
	s2.nameNative(&events.Event{PID: 1, Stack: []uint64{pc2}}, ps2)
	s2.writeNamed(true)
	s2.w.Flush()
	r2, _ := tracefile.NewReader(bytes.NewReader(trace2.Bytes()))
	for {
		rec, err := r2.Next()
		if err != nil {
			break
		}
		if rec.Type == tracefile.TypeSymbols {
			t.Errorf("symbols frame for a process without its own root: %+v", rec.Symbols)
		}
	}
}

// BenchmarkNameNativeSeen is what the event path pays for a container
// process's 32-frame stack whose addresses were all named before (a lookup
// per frame), beside what every event already pays to be decoded and
// encoded again.
func BenchmarkNameNativeSeen(b *testing.B) {
	s, _, ps, pc, _, _ := namerSetup(b)
	stack := make([]uint64, 32)
	for i := range stack {
		stack[i] = pc + uint64(i)
	}
	ev := &events.Event{PID: uint32(os.Getpid()), Stack: stack}
	s.nameNative(ev, ps)
	b.Run("name", func(b *testing.B) {
		for range b.N {
			s.nameNative(ev, ps)
		}
	})
	raw := events.Encode(nil, ev)
	b.Run("decode+encode", func(b *testing.B) {
		var e events.Event
		var buf []byte
		for range b.N {
			if err := events.Decode(raw, &e); err != nil {
				b.Fatal(err)
			}
			buf = events.Encode(buf[:0], &e)
		}
	})
}
