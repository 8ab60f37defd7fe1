package procmodel

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

func maps(path string) []proc.Mapping {
	return []proc.Mapping{{Start: 0x1000, End: 0x2000, Offset: 0x3000, Perms: "r-xp", Dev: "fd:01", Inode: 9, Path: path, BuildID: "ab12"}}
}

// Each stack is read against the capture current when it was first seen;
// one seen before any capture takes the first that comes; a failed capture
// keeps the mappings read before; Forget drops the process and its stacks.
func TestBind(t *testing.T) {
	m := New()
	early := &ledger.Stack{PID: 1, Frames: []uint64{0x1100}}
	m.Bind(1, early)
	if m.CaptureOf(early) != nil {
		t.Fatalf("a stack before any capture is read against %+v", m.CaptureOf(early))
	}
	a := &Capture{PID: 1, Comm: "w", Cmdline: []string{"first"}, Maps: maps("/a")}
	m.Add(a)
	if m.CaptureOf(early) != a {
		t.Errorf("the early stack is read against %+v, want the first capture", m.CaptureOf(early))
	}
	st1 := &ledger.Stack{PID: 1, Frames: []uint64{0x1200}}
	m.Bind(1, st1)
	b := &Capture{PID: 1, Comm: "w", Cmdline: []string{"second"}, Maps: maps("/b")}
	m.Add(b)
	m.Bind(1, st1) // seen again: keeps its capture
	st2 := &ledger.Stack{PID: 1, Frames: []uint64{0x1300}}
	m.Bind(1, st2)
	failed := &Capture{PID: 1, Error: "exited before its mappings could be read"}
	m.Add(failed)
	st3 := &ledger.Stack{PID: 1, Frames: []uint64{0x1400}}
	m.Bind(1, st3)
	if m.CaptureOf(st1) != a || m.CaptureOf(st2) != b || m.CaptureOf(st3) != b {
		t.Errorf("stacks read against %p %p %p, want a=%p b=%p b", m.CaptureOf(st1), m.CaptureOf(st2), m.CaptureOf(st3), a, b)
	}
	p := m.Get(1)
	if p.First != a || p.Latest != failed || p.Current() != b || m.Stacks() != 4 {
		t.Errorf("first %p latest %p current %p stacks %d, want %p %p %p 4", p.First, p.Latest, p.Current(), m.Stacks(), a, failed, b)
	}
	sym := symbolize.New()
	defer sym.Close()
	if f := m.Frames(sym, st1); len(f) != 1 || f[0].Module != "/a" || f[0].Addr != 0x1200 || f[0].BuildID != "ab12" {
		t.Errorf("frames %+v, want one in /a", f)
	}
	m.Forget(1)
	if m.Get(1) != nil || m.Stacks() != 0 || m.CaptureOf(st1) != nil {
		t.Errorf("after Forget: %+v, %d stacks", m.Get(1), m.Stacks())
	}
}

// A View names stacks as the model does, Python frames included, from a
// copy taken before the table grew.
func TestViewFrames(t *testing.T) {
	m := New()
	c := &Capture{PID: 2, Maps: maps("/lib")}
	m.Add(c)
	tb := pystack.NewTable(nil)
	addr := tb.Put(pystack.Code{Code: 1, Units: 2, File: "/app/train.py", Function: "step", Line: 7})
	m.SetPython(2, tb)
	st := &ledger.Stack{PID: 2, Frames: []uint64{addr, 0x1010, pystack.NoPythonAddr}}
	m.Bind(2, st)
	v := NewView()
	v.Add(m, st)
	v.Add(m, nil)
	tb.Put(pystack.Code{Code: 1, Units: 2, File: "/app/other.py", Function: "later", Line: 1}) // after the copy
	got := v.Frames(nil, st)
	if len(got) != 3 || got[0].Function != "step" || got[0].File != "/app/train.py" || got[0].Line != 7 ||
		got[1] != (symbolize.Frame{Addr: 0x1010}) || got[2].Function != pystack.NoPythonFunction {
		t.Errorf("view frames %+v", got)
	}
	if v.CaptureOf(st) != c || len(v.Frames(nil, nil)) != 0 {
		t.Errorf("view capture %p, want %p", v.CaptureOf(st), c)
	}
	if got := m.Frames(nil, st); got[0].Function != "later" {
		t.Errorf("model frames %+v, want the table as it is now", got)
	}
}

// The trace file's process frame and the model's capture convert both
// ways without loss, and the file's JSON is what tracefile pins.
func TestFileRoundTrip(t *testing.T) {
	c := &Capture{PID: 4242, PPID: 4000, Comm: "python3", Cmdline: []string{"python3", "train.py"}, Exe: "/usr/bin/python3",
		Time: 5, Start: 6, Maps: maps("/usr/bin/python3"), Root: "/proc/4242/root", OwnRoot: true,
		Container: "c0ffee", Pod: "pod", Error: "e"}
	if got := FromFile(c.File()); !reflect.DeepEqual(got, c) {
		t.Errorf("round trip %+v, want %+v", got, c)
	}
	b, err := json.Marshal(c.File().Maps)
	if err != nil {
		t.Fatal(err)
	}
	const want = `[{"start":4096,"end":8192,"offset":12288,"perms":"r-xp","dev":"fd:01","inode":9,"path":"/usr/bin/python3","build_id":"ab12"}]`
	if string(b) != want {
		t.Errorf("maps JSON %s, want %s", b, want)
	}
	if (&Capture{}).File().Maps != nil || FromFile(&tracefile.Process{Maps: []tracefile.Mapping{}}).Maps == nil {
		t.Error("nil and empty mappings must stay apart (null and [] in the file)")
	}
	syms := []Symbol{{BuildID: "ab12", Offset: 0x3100, Frame: symbolize.Frame{Offset: 0x100, Function: "f", File: "f.c", Line: 3}}}
	if got := SymbolsFromFile(SymbolsFile(syms).Frames); !reflect.DeepEqual(got, syms) {
		t.Errorf("symbols round trip %+v, want %+v", got, syms)
	}
}

// A container's files are opened through /proc/PID/root while it lives;
// once it is gone, only host files with the build ID it mapped are.
func TestUnwindFiles(t *testing.T) {
	pid := os.Getpid()
	start, err := proc.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := symbolize.BuildID(exe)
	if id == "" {
		t.Skip("the test binary has no build ID")
	}
	ms := []proc.Mapping{
		{Start: 0x1000, End: 0x2000, Perms: "r-xp", Inode: 1, Path: exe, BuildID: id},
		{Start: 0x3000, End: 0x4000, Perms: "r-xp", Inode: 2, Path: exe, BuildID: "0000"},
		{Start: 0x5000, End: 0x6000, Perms: "r-xp", Inode: 3, Path: "/no/build/id"},
	}
	host := &Capture{PID: uint32(pid), Start: start, Maps: ms}
	if got := host.UnwindFiles(); !reflect.DeepEqual(got, ms) {
		t.Errorf("host process: %+v, want its mappings as they are", got)
	}
	live := &Capture{PID: uint32(pid), Start: start, OwnRoot: true, Maps: ms}
	got := live.UnwindFiles()
	if len(got) != 3 || got[0].Path != proc.RootPath(pid, exe) || got[2].Path != proc.RootPath(pid, "/no/build/id") {
		t.Errorf("live container: %+v, want every path through /proc/%d/root", got, pid)
	}
	gone := &Capture{PID: uint32(pid), Start: start + 1, OwnRoot: true, Maps: ms}
	if got := gone.UnwindFiles(); len(got) != 1 || got[0] != ms[0] {
		t.Errorf("gone container: %+v, want only the host file with its build ID", got)
	}
}

func TestCovers(t *testing.T) {
	c := &Capture{Maps: append(maps("/a"), proc.Mapping{Start: 0x8000, End: 0x9000})}
	if !c.Covers([]uint64{0x1000, 0x8fff}) || c.Covers([]uint64{0x1000, 0x2000}) || (*Capture)(nil).Covers([]uint64{1}) ||
		!(*Capture)(nil).Covers(nil) {
		t.Error("Covers")
	}
}

// A process's mappings as /proc lists them, in address order, with gaps
// between them: every address inside one is covered, and none in a gap,
// below the first or above the last; mappings out of order (a capture
// built by hand) are still searched right.
func TestCoversManyMappings(t *testing.T) {
	ms := spacedMappings(500)
	c := &Capture{Maps: ms}
	for i, m := range ms {
		if !c.Covers([]uint64{m.Start, m.End - 1, m.Start + 0x800}) {
			t.Fatalf("mapping %d [%#x, %#x) not covered", i, m.Start, m.End)
		}
		if c.Covers([]uint64{m.Start, m.End}) {
			t.Fatalf("%#x, in the gap after mapping %d, covered", m.End, i)
		}
	}
	if c.Covers([]uint64{0xffff}) || c.Covers([]uint64{ms[len(ms)-1].End + 0x100000}) {
		t.Error("an address outside every mapping is covered")
	}
	rev := slices.Clone(ms)
	slices.Reverse(rev)
	r := &Capture{Maps: rev}
	if !r.Covers([]uint64{ms[0].Start, ms[250].Start + 1, ms[499].End - 1}) || r.Covers([]uint64{ms[250].End}) {
		t.Error("mappings out of address order: searched wrong")
	}
}

// A PyTorch process's capture: 64-81 executable mappings in the H100 runs'
// traces (docs/gpu-validation.md), and stacks of about 40 frames. The live
// reader asks this twice a record.
func BenchmarkCovers(b *testing.B) {
	ms := spacedMappings(80)
	c := &Capture{Maps: ms}
	stack := make([]uint64, 40)
	for i := range stack {
		stack[i] = ms[(i*37)%len(ms)].Start + 0x10
	}
	for b.Loop() {
		if !c.Covers(stack) {
			b.Fatal("not covered")
		}
	}
}

// spacedMappings is n mappings of 8 KiB in address order, 4 KiB apart.
func spacedMappings(n int) []proc.Mapping {
	var ms []proc.Mapping
	for i := range uint64(n) {
		ms = append(ms, proc.Mapping{Start: 0x10000 + i*0x3000, End: 0x10000 + i*0x3000 + 0x2000})
	}
	return ms
}

// SameFiles compares only the executable file mappings, in order: data,
// anonymous and [vdso] mappings may come and go; a library mapped, moved,
// or replaced by another file at the same place is a change.
func TestSameFiles(t *testing.T) {
	exe := func(start uint64, path string, inode uint64) proc.Mapping {
		return proc.Mapping{Start: start, End: start + 0x1000, Perms: "r-xp", Dev: "08:01", Inode: inode, Path: path}
	}
	c := &Capture{Maps: []proc.Mapping{exe(0x1000, "/bin/a", 1), exe(0x5000, "/lib/b.so", 2)}}
	same := []proc.Mapping{exe(0x1000, "/bin/a", 1), {Start: 0x2000, End: 0x3000, Perms: "rw-p"},
		exe(0x5000, "/lib/b.so", 2), {Start: 0x9000, End: 0xa000, Perms: "r-xp", Path: "[vdso]"}}
	if !c.SameFiles(same) {
		t.Error("the same files, with data and [vdso] mappings beside them: reported changed")
	}
	for name, all := range map[string][]proc.Mapping{
		"a library mapped since": {exe(0x1000, "/bin/a", 1), exe(0x3000, "/lib/new.so", 3), exe(0x5000, "/lib/b.so", 2)},
		"a library unmapped":     {exe(0x1000, "/bin/a", 1)},
		"a library moved":        {exe(0x1000, "/bin/a", 1), exe(0x7000, "/lib/b.so", 2)},
		"another file there":     {exe(0x1000, "/bin/a", 1), exe(0x5000, "/lib/b.so", 9)},
	} {
		if c.SameFiles(all) {
			t.Errorf("%s: reported the same", name)
		}
	}
}
