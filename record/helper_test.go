package record

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
)

// What the launch helper's loader reports before its exec of the command
// (its libraries, mapped while it was put in the PID filter) is
// cudatrace's own image: no capture, no unwind rows made of its files. Its
// notes after the exec are the command's, taken as any process's.
func TestLaunchHelperNotes(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	tr, err := loader.New(loader.Options{})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	s := tracerSession(tr)
	defer s.attaching.Wait()
	s.uw = newUWTables(tr)
	defer s.uw.close()
	cmd := exec.Command(testenv.LookPath(t, "sleep"), "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait() //nolint:errcheck // killed
	}()
	pid := uint32(cmd.Process.Pid)
	waitMapped(t, int(pid), filepath.Base(cmd.Path))
	var st unix.Stat_t
	if err := unix.Stat(cmd.Path, &st); err != nil {
		t.Fatal(err)
	}
	exe := proc.FileID{Dev: st.Dev, Ino: st.Ino}
	asked := func() (bool, int) {
		s.uw.mu.Lock()
		defer s.uw.mu.Unlock()
		_, ok := s.uw.file[exe]
		return ok, len(s.uw.file)
	}

	s.child = &child{cmd: cmd, name: "sleep", done: make(chan struct{})}
	s.mapped(pid, 1, nil)
	if ok, n := asked(); ok || n != 0 {
		t.Fatalf("before its exec note: %d files asked for rows (its executable: %v), want none", n, ok)
	}
	if l := s.lives[pid]; l != nil && l.pending != nil {
		t.Fatalf("before its exec note: the helper's mappings kept as the command's (%d)", len(l.pending.Maps))
	}

	s.child.execd = true // what session.exec sets at the exec note
	s.mapped(pid, 2, nil)
	if ok, n := asked(); !ok {
		t.Fatalf("after its exec note: its executable's rows not asked for (%d files asked)", n)
	}
	if l := s.lives[pid]; l == nil || l.pending == nil {
		t.Fatal("after its exec note: its mappings not kept")
	}
}
