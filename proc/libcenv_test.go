package proc

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// startRenamed starts prog (args after it) with env and waits for its
// "ready" line: by then it has written its title over its argv and
// environment area. It runs until the test ends.
func startRenamed(t *testing.T, env []string, prog string, args ...string) int {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if !strings.HasPrefix(line, "ready") {
		t.Fatalf("%s: %q, %v", prog, line, err)
	}
	return cmd.Process.Pid
}

// environArea is what is left between pid's env_start and env_end.
func environArea(t *testing.T, pid int) []byte {
	t.Helper()
	lo, hi, err := envBounds(pid)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, hi-lo)
	if err := OpenMem(pid).ReadAt(b, lo); err != nil {
		t.Fatal(err)
	}
	return b
}

func buildClobber(t *testing.T, name string, flags ...string) string {
	t.Helper()
	cc := testenv.LookPath(t, "gcc")
	bin := filepath.Join(t.TempDir(), name)
	args := append(append([]string{"-O1", "-o", bin}, flags...), filepath.Join("testdata", "clobber.c"))
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return bin
}

var renamedEnv = []string{"RANK=5", "WORLD_SIZE=8", "TORCHELASTIC_RUN_ID=run-37", "EMPTY=", "PATH=" + os.Getenv("PATH")}

// TestEnvironRenamed: a process that wrote a title over its argv and
// environment area as setproctitle does (testdata/clobber.c) still has
// the environment it started with read: from the copies its C library's
// environ points at, whether that variable is the executable's own copy
// (a PIE's copy relocation) or libc's (code built with -fPIC reaches it
// through the GOT). Its command line reads as the title, without the
// NULs that pad it.
func TestEnvironRenamed(t *testing.T) {
	for _, c := range []struct {
		name  string
		flags []string
	}{{"copyreloc", []string{"-fPIE", "-pie"}}, {"libc", []string{"-fPIC", "-pie"}}} {
		t.Run(c.name, func(t *testing.T) {
			pid := startRenamed(t, renamedEnv, buildClobber(t, c.name, c.flags...), "--a", "b")
			if b := environArea(t, pid); !clobbered(b) || len(splitEnviron(b)) != 0 {
				t.Fatalf("the environment area after the rename reads %q: not written over", b)
			}
			got, err := Environ(pid)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, renamedEnv) {
				t.Errorf("Environ = %q, want %q", got, renamedEnv)
			}
			if cmd, err := Cmdline(pid); err != nil || !slices.Equal(cmd, []string{"ray::Worker"}) {
				t.Errorf("Cmdline = %q, %v; want [ray::Worker]", cmd, err)
			}
		})
	}
}

// TestEnvironRenamedStatic: a static program that renamed itself has no
// dynamic symbol to find its environment by: Environ says so, rather than
// returning an empty environment as if it had started with none.
func TestEnvironRenamedStatic(t *testing.T) {
	bin := buildClobber(t, "static", "-static")
	pid := startRenamed(t, renamedEnv, bin)
	env, err := Environ(pid)
	if err == nil || !strings.Contains(err.Error(), "wrote over its environment's memory (setproctitle)") {
		t.Errorf("Environ = %q, %v; want an error saying it wrote over it", env, err)
	}
}

// TestEnvironSetproctitle: a Python worker that calls the real
// setproctitle (Debian's python3-setproctitle, for its python3.11, whose
// executable has its own copy of environ) keeps the environment it
// started with.
func TestEnvironSetproctitle(t *testing.T) {
	py := "/usr/bin/python3.11"
	if err := exec.Command(py, "-c", "import setproctitle").Run(); err != nil {
		testenv.SkipOrFail(t, "%s with setproctitle (Debian's python3-setproctitle, scripts/deps.sh) is needed: %v", py, err)
	}
	script := `import setproctitle, sys
setproctitle.setproctitle("ray::Worker")
print("ready", flush=True)
sys.stdin.read()
`
	pid := startRenamed(t, renamedEnv, py, "-c", script)
	if b := environArea(t, pid); !clobbered(b) {
		t.Fatalf("the environment area after setproctitle reads %q: not written over", b)
	}
	got, err := Environ(pid)
	if err != nil {
		t.Fatal(err)
	}
	// CPython may add to its environment as it starts (none of these).
	for _, kv := range renamedEnv {
		if !slices.Contains(got, kv) {
			t.Errorf("Environ = %q: no %q", got, kv)
		}
	}
	if cmd, err := Cmdline(pid); err != nil || !slices.Equal(cmd, []string{"ray::Worker"}) {
		t.Errorf("Cmdline = %q, %v; want [ray::Worker]", cmd, err)
	}
}

func TestClobbered(t *testing.T) {
	for _, c := range []struct {
		area string
		want bool
	}{
		{"", false},
		{"A=1\x00B=2\x00", false},
		{"A=1\x00B=\x00", false},
		{"ray::Worker\x00\x00\x00\x00", true},
		{"\x00\x00\x00\x00", true},
		{"\x00A=1\x00", true},
		{"A=1\x00\x00B=2\x00", true},
		{"title", true},
	} {
		if got := clobbered([]byte(c.area)); got != c.want {
			t.Errorf("clobbered(%q) = %v, want %v", c.area, got, c.want)
		}
	}
}

// TestOpenMapped: the file a mapping names is opened only where it is the
// mapped file: a FIFO left at its path is refused at once (no wait for a
// writer), and so is another file there.
func TestOpenMapped(t *testing.T) {
	maps, err := ReadMaps(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var m Mapping
	for _, mm := range maps {
		if mm.Exec() && mm.File() {
			m = mm
			break
		}
	}
	f, err := OpenMapping(os.Getpid(), m)
	if err != nil {
		t.Fatalf("OpenMapping(%s): %v", m.Path, err)
	}
	f.Close()
	dir := t.TempDir()
	fifo, other := filepath.Join(dir, "fifo"), filepath.Join(dir, "other")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(other, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, other} {
		mm := m
		mm.Path = p
		// Refused, or (root: through /proc/PID/map_files) the very file
		// the mapping maps, never what stands at the path.
		if f, err := OpenMapping(os.Getpid(), mm); err == nil {
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Ino != m.Inode {
				t.Errorf("OpenMapping of %s as %s's mapping opened inode %d, want %d or an error", p, m.Path, st.Ino, m.Inode)
			}
			f.Close()
		}
	}
}
