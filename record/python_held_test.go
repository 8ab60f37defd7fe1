package record

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
)

// A script whose main thread waits in pause() two Python frames deep.
const heldScript = `import ctypes
libc = ctypes.CDLL(None)


def inner():
    print("ready", flush=True); libc.pause()


inner()
`

// The first record of a CPython process, held by BPF, gets its thread's
// Python frames as BPF would have recorded them; records BPF does not
// walk (frees, cuMemMap) or that were not held get none, and a thread the
// interpreter does not know is flagged as having none.
func TestHeldPython(t *testing.T) {
	python := testenv.Python(t, "3.12")
	script := filepath.Join(t.TempDir(), "held.py")
	if err := os.WriteFile(script, []byte(heldScript), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, script)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if l, err := bufio.NewReader(out).ReadString('\n'); err != nil || l != "ready\n" {
		t.Fatalf("script said %q, %v", l, err)
	}
	pid := cmd.Process.Pid
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("[%s:6:inner %s:9:<module>]", script, script)
	for _, c := range []struct {
		name  string
		ev    events.Event
		want  string // the Python frames resolved; "" for none
		flags uint16 // added
	}{
		{"held allocation", events.Event{API: events.CudaMalloc, Flags: events.FlagHeld}, want, events.FlagPython | events.FlagPyHead},
		{"held free", events.Event{API: events.CudaFree, Flags: events.FlagHeld | events.FlagEntryOnly}, "", 0},
		{"held cuMemMap", events.Event{API: events.CuMemMap, Flags: events.FlagHeld | events.FlagAux}, "", 0},
		{"allocation not held", events.Event{API: events.CudaMalloc}, "", 0},
		{"held, another thread", events.Event{API: events.CudaMalloc, Flags: events.FlagHeld, TID: uint32(pid) + 1<<20}, "", events.FlagNoPython},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr strings.Builder
			s := newState(Options{Stderr: &stderr}, nil)
			s.ev = c.ev
			s.ev.PID = uint32(pid)
			if s.ev.TID == 0 {
				s.ev.TID = uint32(pid)
			}
			ps := &liveProc{}
			s.detectPython(uint32(pid), ps, "", maps)
			if ps.py == nil {
				t.Fatalf("no interpreter found: %s", stderr.String())
			}
			if got := s.ev.Flags &^ c.ev.Flags; got != c.flags {
				t.Errorf("flags added %#x, want %#x", got, c.flags)
			}
			if got := resolved(t, ps.py, pid, s.ev.Py); got != c.want {
				t.Errorf("Python frames %s, want %s", got, c.want)
			}
			if c.want != "" {
				// <module> ran from C (PyRun): the outermost of its run.
				if py := s.ev.Py; py[0].Flags != 0 || py[len(py)-1].Flags != events.PyEntry {
					t.Errorf("frames %+v: want the outermost alone an entry", py)
				}
			}
			if stderr.Len() > 0 {
				t.Errorf("warned: %s", stderr.String())
			}
		})
	}
}

func resolved(t *testing.T, in *pystack.Interp, pid int, py []events.PyFrame) string {
	t.Helper()
	if len(py) == 0 {
		return ""
	}
	m, err := pystack.OpenMem(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var out []string
	for _, f := range py {
		fr, err := in.Code(m, f.Code, int64(f.Units))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s:%d:%s", fr.File, fr.Line, fr.Function))
	}
	return "[" + strings.Join(out, " ") + "]"
}
