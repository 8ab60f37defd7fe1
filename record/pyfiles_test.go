package record

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/bpf"
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
	p := newPyFiles(t, tr)
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
	p := newPyFiles(t, tr)
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

// newPyFiles is a set on tr whose goroutines (probes put in and ended,
// passes over the mappings) are over before the test's tracer closes, as
// Run waits for them.
func newPyFiles(t *testing.T, tr *loader.Tracer) *pyFileSet {
	p := &pyFileSet{tr: tr}
	t.Cleanup(p.later.Wait)
	return p
}

// copyPython copies src into a directory of the test's: a file of its
// own (device and inode), which sweep may forget.
func copyPython(t *testing.T, src string) (string, proc.FileID) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	c := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.WriteFile(c, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(c, &st); err != nil {
		t.Fatal(err)
	}
	return c, proc.FileID{Dev: st.Dev, Ino: st.Ino}
}

// runPython starts python reading its standard input until it closes,
// which stop does (and waits for its end).
func runPython(t *testing.T, python string) (stop func()) {
	t.Helper()
	cmd := exec.Command(python, "-c", "import sys; sys.stdin.read()")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil { // exec'd once Start returns: it maps the file
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			in.Close()
			cmd.Wait() //nolint:errcheck // its end is all that matters
		}
	}
	t.Cleanup(stop)
	return stop
}

// A container's interpreter file (learned through a process's root: no
// host path outlives the container) stays in BPF while a process maps it;
// once none does, a pass over every process's mappings (sweep, then the
// next sweep takes its answer) forgets it in BPF, and the pass after, if
// no layout was marked for its code_dealloc probe since, ends the probe.
// A layout marked meanwhile keeps the probe one pass more.
func TestPyFilesForgetUnmapped(t *testing.T) {
	tr, src := pyFilesSetup(t)
	python, id := copyPython(t, src)
	in, err := pystack.DetectFile(python)
	if err != nil || in == nil {
		t.Fatalf("DetectFile(%s) = %v, %v", python, in, err)
	}
	p := newPyFiles(t, tr)
	dev := devName(id.Dev)
	if err := p.learn(dev, id.Ino, python, in, ""); err != nil {
		t.Fatal(err)
	}
	p.later.Wait()
	pass := func() {
		p.sweep()
		p.later.Wait()
	}
	inBPF := func() bool {
		_, err := tr.PythonFile(dev, id.Ino)
		return err == nil
	}
	if !inBPF() || !tr.CodeFreeReady(id) {
		t.Fatalf("learned: in BPF %v, its probe in %v; want both", inBPF(), tr.CodeFreeReady(id))
	}
	stop := runPython(t, python)
	for range 3 {
		pass()
	}
	if !inBPF() || len(p.known) != 1 || !tr.CodeFreeReady(id) || len(p.retired) != 0 {
		t.Fatalf("mapped by a process, three passes on: in BPF %v, %d known, probe in %v, %d retired; want true, 1, true, 0",
			inBPF(), len(p.known), tr.CodeFreeReady(id), len(p.retired))
	}
	stop()
	pass() // unmapped: starts a pass
	pass() // its answer: forgotten in BPF; another pass starts
	if inBPF() || len(p.known) != 0 || !tr.CodeFreeReady(id) || len(p.retired) != 1 {
		t.Fatalf("unmapped, two passes on: in BPF %v, %d known, probe in %v, %d retired; want false, 0, true, 1",
			inBPF(), len(p.known), tr.CodeFreeReady(id), len(p.retired))
	}
	// A layout marked now (a process seen mapping it just before the
	// pass started had it counted): the pass under way cannot end it.
	o, err := in.BPF()
	if err != nil {
		t.Fatal(err)
	}
	if !p.countFrees(in, python, id, &o, false) {
		t.Fatal("countFrees did not mark a layout of a file whose probe is in")
	}
	pass()
	if !tr.CodeFreeReady(id) || tr.CodeFreeFiles() != 1 {
		t.Fatalf("a layout marked during the pass: probe in %v (%d files), want it in", tr.CodeFreeReady(id), tr.CodeFreeFiles())
	}
	pass()
	if tr.CodeFreeReady(id) || tr.CodeFreeFiles() != 0 || len(p.retired) != 0 || len(p.marked) != 0 || p.scanning {
		t.Fatalf("the pass after: probe in %v, %d files, %d retired, %d marked, scanning %v; want false, 0, 0, 0, false",
			tr.CodeFreeReady(id), tr.CodeFreeFiles(), len(p.retired), len(p.marked), p.scanning)
	}
}

// A host interpreter file removed while a process runs it is forgotten in
// BPF at once (its inode may go to another file), and its code_dealloc
// probe, which that process's layout may count on, stays until it ends;
// learned again meanwhile, it is no longer retired.
func TestPyFilesRemovedWhileMapped(t *testing.T) {
	tr, src := pyFilesSetup(t)
	python, id := copyPython(t, src)
	p := newPyFiles(t, tr)
	p.learnFiles([]string{python})
	p.later.Wait()
	if !tr.CodeFreeReady(id) {
		t.Fatal("learned: its probe not in")
	}
	stop := runPython(t, python)
	// The kernel keeps a running file's inode: a copy elsewhere stands in
	// for the upgrade that replaced it.
	if err := os.Remove(python); err != nil {
		t.Fatal(err)
	}
	pass := func() {
		p.sweep()
		p.later.Wait()
	}
	pass()
	if _, err := tr.PythonFile(devName(id.Dev), id.Ino); err == nil || len(p.known) != 0 || len(p.retired) != 1 {
		t.Fatalf("removed: in BPF (%v), %d known, %d retired; want absent, 0, 1", err, len(p.known), len(p.retired))
	}
	for range 3 {
		pass()
	}
	if !tr.CodeFreeReady(id) {
		t.Fatal("removed, still running: its probe ended")
	}
	stop()
	pass()
	pass()
	if tr.CodeFreeReady(id) || tr.CodeFreeFiles() != 0 || len(p.retired) != 0 {
		t.Fatalf("removed, no longer running: probe in %v, %d files, %d retired; want false, 0, 0", tr.CodeFreeReady(id), tr.CodeFreeFiles(), len(p.retired))
	}
}

// A pass that cannot read a process's mappings takes that process as
// counting on some probe only where its layout in BPF is marked so.
func TestPyFilesScanUnread(t *testing.T) {
	tr, _ := pyFilesSetup(t)
	root := t.TempDir()
	old := proc.Root
	proc.Root = root
	t.Cleanup(func() { proc.Root = old })
	const pid = 1<<22 + 11 // above pid_max's largest: never a process
	// Its maps a directory: unreadable.
	if err := os.MkdirAll(filepath.Join(root, strconv.Itoa(pid), "maps"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := newPyFiles(t, tr)
	id := proc.FileID{Dev: 1, Ino: 2}
	scan := func() fileScan {
		return p.scan(fileScan{epoch: 1, asked: map[proc.FileID]fileID{id: {}}})
	}
	if r := scan(); r.failed || r.counted || len(r.mapped) != 0 {
		t.Errorf("an unread process without a layout: %+v, want nothing counted, nothing mapped", r)
	}
	var o bpf.CudatraceCtPyoffsets
	o.InterpCodeGen = -1
	if err := tr.SetPython(pid, &o); err != nil {
		t.Fatal(err)
	}
	if r := scan(); r.counted {
		t.Errorf("an unread process with an unmarked layout: counted")
	}
	o.InterpCodeGen = pystack.GenFrees
	if err := tr.SetPython(pid, &o); err != nil {
		t.Fatal(err)
	}
	if r := scan(); !r.counted {
		t.Errorf("an unread process with a layout marked as counted: not counted")
	}
	tr.Forget(pid)
}
