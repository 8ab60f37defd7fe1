package pystack

import (
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Each interpreter-loop frame of the native stack, innermost first, gives
// way to one run of Python frames; runs left over go at the outer end.
func TestMerge(t *testing.T) {
	eval := [][2]uint64{{0x5000, 0x6000}, {0x9000, 0x9100}} // the loop and its .cold part
	py := []events.PyFrame{
		{Code: 1}, {Code: 2, Flags: events.PyEntry}, // the innermost C call's run
		{Code: 3, Flags: events.PyEntry},
		{Code: 4}, {Code: 5}, // the last run, never flagged (cut short)
	}
	addr := func(f events.PyFrame) uint64 { return 0xf00 + f.Code }
	native := []uint64{0x1000, 0x5010, 0x2000, 0x9050, 0x3000}
	got := Merge(nil, native, py, eval, addr)
	want := []uint64{0x1000, 0xf01, 0xf02, 0x2000, 0xf03, 0x3000, 0xf04, 0xf05}
	if !slices.Equal(got, want) {
		t.Fatalf("merged %x, want %x", got, want)
	}
	// More loop frames than runs: the extra ones stay native.
	got = Merge(nil, []uint64{0x5010, 0x2000, 0x5020}, py[:2], eval, addr)
	if want := []uint64{0xf01, 0xf02, 0x2000, 0x5020}; !slices.Equal(got, want) {
		t.Fatalf("merged %x, want %x", got, want)
	}
	// CPython 3.14's tail-calling interpreter: the handler of the
	// instruction that made the C call (_TAIL_CALL_CALL_BUILTIN_FAST, in
	// the loop's ranges) stands right above _PyEval_EvalFrameDefault; the
	// two are one call of the loop, and give way to one run. Another
	// handler in the next call of the loop, as the specializing
	// interpreter may pick for the same line, makes the same stack.
	tail := [][2]uint64{{0x5000, 0x5100}, {0x7000, 0x7040}, {0x7040, 0x7100}} // _PyEval_EvalFrameDefault, two handlers
	for _, handler := range []uint64{0x7010, 0x7050} {
		native := []uint64{0x1000, handler, 0x5010, 0x2000, 0x7020, 0x5010, 0x3000}
		got = Merge(nil, native, py, tail, addr)
		want := []uint64{0x1000, 0xf01, 0xf02, 0x2000, 0xf03, 0x3000, 0xf04, 0xf05}
		if !slices.Equal(got, want) {
			t.Fatalf("tail-calling interpreter: merged %x, want %x", got, want)
		}
	}
	// dst's contents stay in front: a caller's reused buffer.
	got = Merge([]uint64{7}, []uint64{0x1000}, nil, eval, addr)
	if want := []uint64{7, 0x1000}; !slices.Equal(got, want) {
		t.Fatalf("merged %x, want %x", got, want)
	}
}

// A table numbers frames as they come; stacks that differ only in their
// Python frames (the same native stack, another line) come out different,
// and the numbers name the frames again.
func TestTable(t *testing.T) {
	eval := [][2]uint64{{0x5000, 0x6000}}
	tb := NewTable(eval)
	a := tb.Put(Code{Code: 0xc0de, Units: 4, File: "/app/train.py", Function: "forward", Line: 12})
	b := tb.Put(Code{Code: 0xc0de, Units: 9, File: "/app/train.py", Function: "forward", Line: 14})
	if a == b || !IsPython(a) || !IsPython(b) || IsPython(0x7f0000001000) {
		t.Fatalf("addresses %#x and %#x", a, b)
	}
	if !tb.Has(0xc0de, 4) || tb.Has(0xc0de, 5) || tb.Len() != 2 {
		t.Fatalf("Has or Len wrong: %d frames", tb.Len())
	}
	ev := func(units int32) *events.Event {
		return &events.Event{Flags: events.FlagPython, Stack: []uint64{0x1000, 0x5010, 0x3000},
			Py: []events.PyFrame{{Code: 0xc0de, Units: units, Flags: events.PyEntry}}}
	}
	s12, ok := tb.Stack(nil, ev(4))
	s14, _ := tb.Stack(nil, ev(9))
	if !ok || !slices.Equal(s12, []uint64{0x1000, a, 0x3000}) || !slices.Equal(s14, []uint64{0x1000, b, 0x3000}) {
		t.Fatalf("merged %x and %x", s12, s14)
	}
	// A frame the recorder never resolved is numbered all the same.
	s, _ := tb.Stack(nil, ev(20))
	if tb.Len() != 3 || s[1] != addrBit|3 {
		t.Fatalf("unresolved frame: %x, %d frames", s, tb.Len())
	}
	if f := tb.Frame(s[1]); f.Function != "[unresolved Python frame: not resolved while recording]" || f.Module != Module ||
		f.File != "" || f.Line != 0 || tb.Unresolved() != 1 {
		t.Errorf("unresolved frame named %+v", f)
	}
	// A thread without Python frames: the marker at the outer end.
	s, ok = tb.Stack([]uint64{}, &events.Event{Flags: events.FlagNoPython, Stack: []uint64{0x1000, 0x2000}})
	if !ok || !slices.Equal(s, []uint64{0x1000, 0x2000, NoPythonAddr}) {
		t.Fatalf("no-Python stack %x", s)
	}
	if _, ok := tb.Stack(nil, &events.Event{Stack: []uint64{0x1000}}); ok {
		t.Error("an event without Python facts was merged")
	}

	frames := []symbolize.Frame{{Addr: 0x1000, Function: "cudaMalloc"}, {Addr: a}, {Addr: NoPythonAddr}}
	tb.Fill(frames)
	want := []symbolize.Frame{{Addr: 0x1000, Function: "cudaMalloc"},
		{Addr: a, Function: "forward", File: "/app/train.py", Line: 12, Module: Module},
		{Addr: NoPythonAddr, Function: NoPythonFunction, Module: Module}}
	if !slices.Equal(frames, want) {
		t.Fatalf("filled %+v\nwant %+v", frames, want)
	}

	// Names: a copy that later puts do not change.
	n := tb.Names(nil, []uint64{0x1000, b, NoPythonAddr})
	tb.Put(Code{Code: 0xc0de, Units: 9, File: "/app/other.py", Function: "changed", Line: 1})
	frames = []symbolize.Frame{{Addr: b}, {Addr: NoPythonAddr}, {Addr: a}}
	n.Fill(frames)
	want = []symbolize.Frame{{Addr: b, Function: "forward", File: "/app/train.py", Line: 14, Module: Module},
		{Addr: NoPythonAddr, Function: NoPythonFunction, Module: Module},
		{Addr: a, Module: Module}} // not copied: unnamed
	if !slices.Equal(frames, want) || len(n) != 2 {
		t.Fatalf("names filled %+v\nwant %+v (%d names)", frames, want, len(n))
	}
	if tb.Names(nil, []uint64{0x1000}) != nil {
		t.Error("names of a stack without Python frames are not nil")
	}
	// Codes lists the puts in order, from where a reader left off.
	if c := tb.Codes(2); len(c) != 1 || c[0].Units != 20 {
		t.Errorf("Codes(2) = %+v", c)
	}
	if c := tb.Codes(5); len(c) != 0 {
		t.Errorf("Codes(5) = %+v", c)
	}
	// A nil table still names the marker.
	var none *Table
	if f := none.Frame(NoPythonAddr); f.Function != NoPythonFunction {
		t.Errorf("nil table: %+v", f)
	}
}

// TestTableRenew: a new code object at a freed one's address (its capture
// says another identity) renews the address: its frames get ids of their
// own, the old object's frames keep theirs and their names, and no frame
// of the old object names one of the new (whatever the instruction).
func TestTableRenew(t *testing.T) {
	tb := NewTable(nil)
	const code = 0x7f00dead0000
	oldA := tb.Put(Code{Code: code, Units: 4, File: "/app/old.py", Function: "f", Line: 10})
	oldB := tb.Put(Code{Code: code, Units: 9, File: "/app/old.py", Function: "f", Line: 12})
	newA := tb.Put(Code{Code: code, Units: 4, File: "/app/new.py", Function: "g", Line: 30, Renew: true})
	if newA == oldA || newA == oldB {
		t.Fatalf("the renewed frame got an old id: %#x (old %#x %#x)", newA, oldA, oldB)
	}
	if f := tb.Frame(oldA); f.File != "/app/old.py" || f.Function != "f" || f.Line != 10 {
		t.Errorf("the old object's frame is now %+v", f)
	}
	if f := tb.Frame(newA); f.File != "/app/new.py" || f.Function != "g" || f.Line != 30 {
		t.Errorf("the new object's frame is %+v", f)
	}
	if tb.Has(code, 9) {
		t.Error("the old object's frame at instruction 9 names the new object's")
	}
	ev := &events.Event{Flags: events.FlagPython, Stack: []uint64{0x1000},
		Py: []events.PyFrame{{Code: code, Units: 4, Flags: events.PyEntry}}}
	got, ok := tb.Stack(nil, ev)
	if !ok || len(got) != 2 || got[1] != newA {
		t.Errorf("a record after the renewal merges as %#x, want its frame %#x", got, newA)
	}
	if again := tb.Put(Code{Code: code, Units: 4, File: "/app/new.py", Function: "g", Line: 30}); again != newA {
		t.Errorf("the new object's frame put again got %#x, want %#x", again, newA)
	}
}
