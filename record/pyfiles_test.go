package record

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
)

// pyFilesSetup is a tracer, closed with the test, and Debian 12's
// python3.11, which .ci/run installs.
func pyFilesSetup(t *testing.T) (*loader.Tracer, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	src := "/usr/bin/python3.11"
	if _, err := os.Stat(src); err != nil {
		testenv.SkipOrFail(t, "Debian's python3.11 is needed: %v", err)
	}
	tr, err := loader.New(loader.Options{FilterPIDs: true, StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, src
}

// An interpreter file BPF was taught (py_files, keyed by device and
// inode) is forgotten, in BPF too, once its path no longer names it: its
// inode may be given to another file, which must not take its layout.
func TestPyFilesSweep(t *testing.T) {
	tr, src := pyFilesSetup(t)
	copied := filepath.Join(t.TempDir(), "python3.11")
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(copied, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	out.Close()
	entries := func() uint32 {
		uses, err := tr.MapUses()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range uses {
			if u.Name == "py_files" {
				return u.Entries
			}
		}
		t.Fatal("no py_files in MapUses")
		return 0
	}
	p := &pyFileSet{tr: tr}
	p.learnFiles([]string{copied})
	if n := entries(); n != 1 || len(p.known) != 1 {
		t.Fatalf("after learning %s: %d entries in py_files, %d known; want 1, 1", copied, n, len(p.known))
	}
	p.sweep()
	if n := entries(); n != 1 {
		t.Errorf("the sweep forgot a file still there: %d entries", n)
	}
	if err := os.Remove(copied); err != nil {
		t.Fatal(err)
	}
	p.sweep()
	if n := entries(); n != 0 || len(p.known) != 0 {
		t.Errorf("after its removal: %d entries in py_files, %d known; want 0, 0", n, len(p.known))
	}
}

// An interpreter file learned is in BPF at once, without waiting for
// the mark that its processes' code object frees are counted; once its
// code_dealloc probe is in (countLater, p.later), marked. A process's
// layout given without waiting is marked where its file's probe is in,
// and not where it is not. Debian 12's python3.11 (an executable at a
// fixed address, without symbols: its code_dealloc found from
// PyCode_Type's data word), copied twice: two files.
func TestPyFilesCountLater(t *testing.T) {
	tr, src := pyFilesSetup(t)
	copies := []string{filepath.Join(t.TempDir(), "python3.11"), filepath.Join(t.TempDir(), "python3.11")}
	for _, c := range copies {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c, b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gen := func(path string) int32 {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		o, err := tr.PythonFile(devName(st.Dev), st.Ino)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return o.InterpCodeGen
	}
	p := &pyFileSet{tr: tr}
	p.learnFiles(copies[:1])
	// In BPF before its probe (some 10 ms, an RCU grace period): marked
	// or not, by the time it is read.
	if g := gen(copies[0]); g != -1 && g != pystack.GenFrees {
		t.Errorf("learned for later: interp_code_gen %d at once, want -1 (its probe not in yet) or %d", g, pystack.GenFrees)
	}
	p.later.Wait()
	if g := gen(copies[0]); g != pystack.GenFrees {
		t.Errorf("its probe in: interp_code_gen %d, want %d", g, pystack.GenFrees)
	}
	// A file whose probe is in: a process's layout marked at once, without
	// waiting (setPython's countFrees), and one whose probe is not: not.
	in, err := pystack.DetectFile(copies[1])
	if err != nil || in == nil {
		t.Fatalf("DetectFile(%s) = %v, %v", copies[1], in, err)
	}
	for i, c := range copies {
		var st unix.Stat_t
		if err := unix.Stat(c, &st); err != nil {
			t.Fatal(err)
		}
		o, err := in.BPF()
		if err != nil {
			t.Fatal(err)
		}
		p.countFrees(in, c, proc.FileID{Dev: st.Dev, Ino: st.Ino}, &o, false)
		if want := []int32{pystack.GenFrees, -1}[i]; o.InterpCodeGen != want {
			t.Errorf("%s's process layout, not waiting: interp_code_gen %d, want %d", c, o.InterpCodeGen, want)
		}
	}
}
