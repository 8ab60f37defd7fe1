package unwind

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
)

// chain builds testdata's -O2 -fomit-frame-pointer chain (an executable
// and two libraries, with -g) into dir, with extra compiler flags.
func chain(t testing.TB, dir string, flags ...string) string {
	t.Helper()
	testenv.LookPath(t, "gcc")
	src, _ := filepath.Abs("testdata")
	cc := func(args ...string) {
		t.Helper()
		args = append(append([]string{"-O2", "-fomit-frame-pointer", "-g"}, flags...), args...)
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	cc("-shared", "-fPIC", "-o", filepath.Join(dir, "libchain2.so"), filepath.Join(src, "chain_lib2.c"))
	cc("-shared", "-fPIC", "-o", filepath.Join(dir, "libchain1.so"), filepath.Join(src, "chain_lib1.c"),
		"-L"+dir, "-lchain2", "-Wl,-rpath,"+dir)
	exe := filepath.Join(dir, "dumpself")
	cc("-o", exe, filepath.Join(src, "dumpself.c"), "-L"+dir, "-lchain1", "-lchain2", "-Wl,-rpath,"+dir)
	return exe
}

type dump struct {
	regs   events.Regs
	window []byte
	maps   []proc.Mapping
}

// runDump runs the chain and reads back what chain_leaf saw.
func runDump(t testing.TB, exe string) dump {
	t.Helper()
	out := filepath.Join(filepath.Dir(exe), "dump")
	if b, err := exec.Command(exe, out).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", exe, err, b)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(bytes.NewReader(raw))
	var d dump
	var n int
	if _, err := fmt.Fscanf(r, "%x %x %x %d\n", &d.regs.IP, &d.regs.SP, &d.regs.BP, &n); err != nil {
		t.Fatalf("dump header: %v", err)
	}
	d.window = make([]byte, n)
	if _, err := io.ReadFull(r, d.window); err != nil {
		t.Fatalf("dump window: %v", err)
	}
	d.maps, err = proc.ParseMaps(r)
	if err != nil {
		t.Fatalf("dump maps: %v", err)
	}
	return d
}

// lineOf finds the line of testdata/file marked "// LINE:tag".
func lineOf(t testing.TB, file, tag string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "// LINE:"+tag) {
			return i + 1
		}
	}
	t.Fatalf("no LINE:%s in %s", tag, file)
	return 0
}

type wantFrame struct {
	fn, file string
	line     int
}

func chainWant(t testing.TB) []wantFrame {
	return []wantFrame{
		{"lib1_inner", "chain_lib1.c", lineOf(t, "chain_lib1.c", "lib1_inner")},
		{"lib2_middle", "chain_lib2.c", lineOf(t, "chain_lib2.c", "lib2_middle")},
		{"lib1_outer", "chain_lib1.c", lineOf(t, "chain_lib1.c", "lib1_outer")},
		{"main", "dumpself.c", lineOf(t, "dumpself.c", "main")},
	}
}

// checkChain says where frames, from the leaf's caller on, differ from the
// chain's functions and lines, in order.
func checkChain(t testing.TB, frames []symbolize.Frame, want []wantFrame) {
	t.Helper()
	if len(frames) < len(want) {
		t.Fatalf("%d frames, want at least %d: %+v", len(frames), len(want), frames)
	}
	for i, w := range want {
		f := frames[i]
		if f.Function != w.fn || filepath.Base(f.File) != w.file || f.Line != w.line {
			t.Errorf("frame %d: %s %s:%d, want %s %s:%d", i+1, f.Function, f.File, f.Line, w.fn, w.file, w.line)
		}
	}
}

func TestUnwindOmitFramePointerChain(t *testing.T) {
	d := runDump(t, chain(t, t.TempDir()))
	if d.regs.BP > d.regs.SP && d.regs.BP-d.regs.SP < uint64(len(d.window)) {
		t.Logf("rbp %#x happens to point into the stack", d.regs.BP)
	}
	u := New()
	defer u.Close()
	pcs, stop := u.Unwind(NewMaps(d.maps), d.regs, d.window, false, nil)
	frames := symbolize.New().FramesOf(symbolize.Proc{}, d.maps, pcs)
	for i, f := range frames {
		t.Logf("#%d %#x %s %s:%d (%s)", i, f.Addr, f.Function, f.File, f.Line, filepath.Base(f.Module))
	}
	t.Logf("stop: %s", stop)
	if frames[0].Function != "chain_leaf" {
		t.Errorf("frame 0: %s, want chain_leaf", frames[0].Function)
	}
	checkChain(t, frames[1:], chainWant(t))
	// Below main: libc's start code, then the end of the stack (its
	// return address column is undefined), inside the window.
	if stop.Kind != StopEnd {
		t.Errorf("stopped with %q, want the end of the stack", stop)
	}
	if len(frames) > 8 {
		t.Errorf("%d frames: more than libc's start code below main", len(frames))
	}

	// The same stack with the window cut short, the smallest that reaches
	// lib2_middle, stops there and says the window was the reason.
	var short []uint64
	for n := 8; n <= len(d.window); n += 8 {
		short, stop = u.Unwind(NewMaps(d.maps), d.regs, d.window[:n], false, nil)
		if len(short) >= 3 {
			break
		}
	}
	if stop.Kind != StopWindow || len(short) != 3 || short[2] != pcs[2] {
		t.Fatalf("short window: %x, stop %q; want the first 3 of %x, stopped by the window", short, stop, pcs)
	}
	// Merge continues a short unwind with the frame-pointer frames past
	// its last one, when that frame is among them.
	fp := append([]uint64{pcs[0], 0x1234}, pcs[2:]...)
	if got := Merge(fp, short, stop); fmt.Sprint(got) != fmt.Sprint(pcs) {
		t.Errorf("Merge: %x, want %x", got, pcs)
	}
	if got := Merge(pcs[:2], pcs, Stop{Kind: StopEnd}); len(got) != len(pcs) {
		t.Errorf("Merge kept the shorter stack")
	}
}

// Code whose only CFI is .debug_frame (-fno-asynchronous-unwind-tables
// with -g: the .eh_frame left holds the C runtime's FDEs), and a main that
// realigns its stack (-mstackrealign: its CFA is a DWARF expression on rbp)
// unwind the same.
func TestUnwindDebugFrameAndStackRealign(t *testing.T) {
	for _, flags := range [][]string{
		{"-fno-asynchronous-unwind-tables", "-fno-unwind-tables"},
		{"-mstackrealign"},
	} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			d := runDump(t, chain(t, t.TempDir(), flags...))
			u := New()
			defer u.Close()
			pcs, stop := u.Unwind(NewMaps(d.maps), d.regs, d.window, false, nil)
			frames := symbolize.New().FramesOf(symbolize.Proc{}, d.maps, pcs)
			t.Logf("stop: %s", stop)
			checkChain(t, frames[1:], chainWant(t))
		})
	}
}
