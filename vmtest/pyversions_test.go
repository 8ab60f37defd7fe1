package vmtest

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// pyRunner runs CPython v: "3.12" is pyenv's, "sid-3.15" Debian sid's in
// the sid root scripts/deps.sh makes (its libc is newer than the host's),
// as a container of its own with that root (testenv.RootScript), /tmp
// bind-mounted into it: a path under /tmp means the same inside and out.
type pyRunner struct {
	v      string
	root   string // "" for pyenv's
	python string // the interpreter, a path inside root
}

func newPyRunner(t *testing.T, v string) *pyRunner {
	t.Helper()
	if sv, ok := strings.CutPrefix(v, "sid-"); ok {
		root, python := sidPython(t, sv)
		return &pyRunner{v: v, root: root, python: python}
	}
	return &pyRunner{v: v, python: pyenvPython(t, v)}
}

// minor is the version without its sid- prefix ("3.15"), as the tests'
// version checks take it.
func (p *pyRunner) minor() string { return strings.TrimPrefix(p.v, "sid-") }

// argv runs python with args (paths under /tmp for sid's).
func (p *pyRunner) argv(args ...string) []string {
	if p.root == "" {
		return append([]string{p.python}, args...)
	}
	return []string{"unshare", "-m", "sh", "-c", testenv.RootScript(p.root, []string{"/tmp"}, append([]string{p.python}, args...)...)}
}

// script is testdata's file name where python can read it: its absolute
// path, or for sid's a copy under /tmp.
func (p *pyRunner) script(t *testing.T, name string) string {
	t.Helper()
	s, _ := filepath.Abs(filepath.Join("testdata", name))
	if p.root != "" {
		s = copyToTemp(t, s)
	}
	return s
}

// base is the interpreter's file name, as the report names the process.
func (p *pyRunner) base() string { return filepath.Base(p.python) }

// warm runs, for sid's CPython, one process of it in its root that
// allocates once and lives on until its dynamic loader is probed (its
// _dl_debug_state starts with the uprobe's int3), under a tracer that
// traces every process (--all, the agent), and returns its PID (0 for
// pyenv's). A root no process of which has been seen yet has a loader no
// probe covers: its processes make no note as they start, and the first
// one is first seen at its first record, too late for the Python frames
// of a burst made as it starts (absent, not wrong); the reader probes
// that loader then. What the tests check is every process after that
// first one, as on a node that has run the container's image before.
func (p *pyRunner) warm(t *testing.T, ctx context.Context) int {
	t.Helper()
	if p.root == "" {
		return 0
	}
	code := `import ctypes, sys, time
lib = ctypes.CDLL(sys.argv[1])
lib.cudaMalloc(ctypes.byref(ctypes.c_void_p()), ctypes.c_size_t(4096))
at = ctypes.cast(ctypes.CDLL(None)._dl_debug_state, ctypes.c_void_p).value
end = time.monotonic() + 60
while ctypes.string_at(at, 1) != b"\xcc" and time.monotonic() < end:
    time.sleep(0.02)
print("ready" if ctypes.string_at(at, 1) == b"\xcc" else "loader not probed in 60 s", flush=True)
sys.stdin.readline()
`
	argv := p.argv("-c", code, fakeLib)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = fakeEnv(filepath.Join(t.TempDir(), "warm.log"))
	j := startCmdJob(t, "warm-up", cmd)
	// Another tracer on this machine may have probed that loader: a
	// second more for this one's reader to take the process.
	time.Sleep(time.Second)
	j.in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	return j.pid
}
