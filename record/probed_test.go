package record

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
)

// A CUDA library and a dynamic loader the reader probed for a process
// after tracing began (attachLib; attachLoader, off the reader's
// goroutine) keep their probes while a process maps them; once none does,
// a pass over every process's mappings (sweepProbed, whose answer the
// next sweep takes) ends them, and the tracer forgets both: a process that
// maps the library later has it probed anew. A library the reader saw
// mapped while a pass ran stays one pass more.
func TestProbedFilesEnd(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	ld := loader.SystemLoader()
	if ld == "" {
		t.Skip("no system dynamic loader here")
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "rt.c"), filepath.Join(dir, "libcudart.so.12")
	code := "int cudaMalloc(void **p, unsigned long n) { *p = 0; return (int)n & 0; }\nint cudaFree(void *p) { return p != 0 && 0; }\n"
	if err := os.WriteFile(src, []byte(code), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(testenv.LookPath(t, "gcc"), "-shared", "-fPIC", "-O2", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	b, err := os.ReadFile(ld)
	if err != nil {
		t.Fatal(err)
	}
	ldCopy := filepath.Join(dir, filepath.Base(ld)) // a container's own loader
	if err := os.WriteFile(ldCopy, b, 0o755); err != nil {
		t.Fatal(err)
	}
	tr, err := loader.New(loader.Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	s := tracerSession(tr)
	defer s.attaching.Wait()
	cmd := exec.Command(ldCopy, "/bin/sleep", "60")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cmd.Process.Kill()
			cmd.Wait() //nolint:errcheck // killed
		}
	}
	defer stop()
	pid := cmd.Process.Pid
	waitMapped(t, pid, lib)
	s.attachLib(uint32(pid), lib, 0)
	s.attachLoader(ldCopy, false)
	s.attaching.Wait()
	ldID := fileIDOf(t, ldCopy)
	libID := fileIDOf(t, lib)
	if tr.AttachedLibraries() != 1 || !tr.HasLoader(ldID) {
		t.Fatalf("probed: %d libraries, loader %v; want 1, true", tr.AttachedLibraries(), tr.HasLoader(ldID))
	}
	pass := func() {
		s.sweepProbed()
		s.attaching.Wait()
	}
	for range 3 {
		pass()
	}
	if tr.AttachedLibraries() != 1 || !tr.HasLoader(ldID) {
		t.Fatalf("mapped, three passes on: %d libraries, loader %v; want 1, true", tr.AttachedLibraries(), tr.HasLoader(ldID))
	}
	stop()
	pass()                           // unmapped: a pass starts
	s.attachLib(uint32(pid), lib, 0) // the reader sees it mapped meanwhile (a note)
	pass()                           // its answer: the loader goes, the library stays; another starts
	if tr.HasLoader(ldID) || tr.AttachedLibraries() != 1 || !s.probed.has(libID) || s.probed.has(ldID) {
		t.Fatalf("unmapped, the library seen during the pass: loader %v, %d libraries; want false, 1", tr.HasLoader(ldID), tr.AttachedLibraries())
	}
	pass()
	if tr.AttachedLibraries() != 0 || s.libs.HasInode(libID.Ino) || s.probed.has(libID) {
		t.Fatalf("unmapped, not seen: %d libraries, known %v; want 0, false", tr.AttachedLibraries(), s.libs.HasInode(libID.Ino))
	}
	s.attachLib(uint32(pid), lib, 0)
	if tr.AttachedLibraries() != 1 || !s.probed.has(libID) {
		t.Errorf("mapped anew: %d libraries, want 1", tr.AttachedLibraries())
	}
}

func fileIDOf(t *testing.T, path string) proc.FileID {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return proc.FileID{Dev: st.Dev, Ino: st.Ino}
}

// waitMapped waits, up to 2 s, until process pid maps a file whose path
// holds name: a process started returns from its exec before the kernel
// maps its program, and its loader maps its libraries after.
func waitMapped(t *testing.T, pid int, name string) {
	t.Helper()
	for i := 0; ; i++ {
		maps, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
		if strings.Contains(string(maps), name) {
			return
		}
		if i == 200 {
			t.Fatalf("pid %d never mapped %s", pid, name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tracerSession is a session around tr with what its notes and attaches
// use, and no trace file.
func tracerSession(tr *loader.Tracer) *session {
	return &session{tr: tr, opts: Options{Stderr: io.Discard}, res: &Result{Ledger: ledger.New()},
		lives: map[uint32]*life{}, warned: map[string]bool{}, refusals: make(chan error, 16)}
}
