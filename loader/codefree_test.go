package loader

import (
	"bufio"
	"encoding/binary"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
)

// codeFreeScript frees exactly as many code objects as each line it reads
// says (a module's code object, compiled, run and dropped), then says
// "done"; it says "ready" once its start-up's frees are over.
const codeFreeScript = `
import sys
print("ready", flush=True)
for line in sys.stdin:
    for i in range(int(line)):
        exec(compile("x = %d" % i, "m%d.py" % i, "exec"))
    print("done", flush=True)
`

// TestCodeFreeCounts: ct_code_free, put at pyenv CPython 3.12's
// code_dealloc (found by pystack from PyCode_Type), counts each code
// object the process frees, in its PID's slot of py_code_frees: 250 freed,
// 250 counted. A second attach of the same file is the first's answer,
// no second probe (one count a free). Forgotten (ForgetCodeFree), its
// probe goes, and a later attach puts a new one in.
func TestCodeFreeCounts(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	python, lib := testenv.Python(t, "3.12"), testenv.LibPython(t, "3.12")
	in, err := pystack.DetectFile(lib)
	if err != nil || in == nil {
		t.Fatalf("DetectFile(%s) = %v, %v", lib, in, err)
	}
	off, ok := in.CodeFreeSite()
	if !ok {
		t.Fatalf("%s: no code_dealloc found", lib)
	}
	tr, err := New(Options{FilterPIDs: true, StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	var st unix.Stat_t
	if err := unix.Stat(lib, &st); err != nil {
		t.Fatal(err)
	}
	id := proc.FileID{Dev: st.Dev, Ino: st.Ino}
	for range 2 {
		if err := tr.AttachCodeFree(lib, id, off); err != nil {
			t.Fatal(err)
		}
	}
	probes := tr.codeFree.links
	if n := probes(); n != 1 {
		t.Fatalf("%d probes on code_dealloc after two attaches, want 1", n)
	}
	cmd := exec.Command(python, "-c", codeFreeScript)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	lines := bufio.NewScanner(stdout)
	expect := func(want string) {
		t.Helper()
		if !lines.Scan() || strings.TrimSpace(lines.Text()) != want {
			t.Fatalf("python said %q, want %q (%v)", lines.Text(), want, lines.Err())
		}
	}
	count := func() uint64 {
		t.Helper()
		var v []byte
		if err := tr.objs.maps[".bss"].Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		slot := uint32(cmd.Process.Pid) % 1024 // CT_PY_FREE_SLOTS
		return binary.LittleEndian.Uint64(v[slot*8:])
	}
	expect("ready")
	before := count()
	stdin.Write([]byte("250\n"))
	expect("done")
	if got := count() - before; got != 250 {
		t.Errorf("%d code objects freed counted, want 250", got)
	}
	// Forgotten, the probe goes: nothing counted; attached again, a
	// new one counts.
	end := tr.ForgetCodeFree(id)
	if tr.CodeFreeReady(id) || tr.CodeFreeFiles() != 0 {
		t.Errorf("after ForgetCodeFree: ready %v, %d files, want false, 0", tr.CodeFreeReady(id), tr.CodeFreeFiles())
	}
	end()
	before = count()
	stdin.Write([]byte("100\n"))
	expect("done")
	if got := count() - before; got != 0 {
		t.Errorf("%d code objects freed counted with the probe ended, want 0", got)
	}
	if err := tr.AttachCodeFree(lib, id, off); err != nil || !tr.CodeFreeReady(id) || probes() != 1 {
		t.Fatalf("attached again: %v, ready %v, %d probes; want ready, 1", err, tr.CodeFreeReady(id), probes())
	}
	before = count()
	stdin.Write([]byte("50\n"))
	expect("done")
	if got := count() - before; got != 50 {
		t.Errorf("%d code objects freed counted by the new probe, want 50", got)
	}
}
