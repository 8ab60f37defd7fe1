package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
)

// TestNotifySite finds glibc's notification point in this machine's
// loader: a function, in an executable segment, with _r_debug's r_state
// beside it.
func TestNotifySite(t *testing.T) {
	path := SystemLoader()
	if path == "" {
		t.Skip("no dynamic loader on this machine")
	}
	off, _, err := notifySite(path)
	if err != nil {
		t.Fatal(err)
	}
	if off == 0 {
		t.Errorf("notifySite(%s): offset 0", path)
	}
	if _, _, err := notifySite("/bin/true"); err == nil || !strings.Contains(err.Error(), "no _dl_debug_state") {
		t.Errorf("notifySite(/bin/true) = %v, want no _dl_debug_state", err)
	}
}

// TestAttachLoaderRefusedOnce: a loader that cannot be attached is tried
// once per file, not at every exec of a program it runs. The file is
// rewritten in place (the same inode) between the two calls, from no ELF
// to an ELF without the notification point: the second answer is the
// first's, so the file was not read again.
func TestAttachLoaderRefusedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ld-linux-x86-64.so.2")
	if err := os.WriteFile(path, []byte("not an ELF file"), 0o755); err != nil {
		t.Fatal(err)
	}
	var tr Tracer
	_, first := tr.AttachLoader(path)
	if first == nil {
		t.Fatal("AttachLoader of a file that is no ELF: no error")
	}
	elfNoState, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, elfNoState, 0o755); err != nil { // O_TRUNC: the same inode
		t.Fatal(err)
	}
	attached, again := tr.AttachLoader(path)
	if attached || again == nil || again.Error() != first.Error() {
		t.Errorf("AttachLoader again = %v, %v; want the first refusal, %v", attached, again, first)
	}
	if n := tr.ldProbes.links(); n != 0 {
		t.Errorf("a refused loader left %d links", n)
	}
}

// TestHasLoaderByMapping: a loader already probed is known by its
// mapping's device and inode, whatever path the mapping shows (a shell
// that pivot_root-ed and unmounted the old root maps the host's loader
// under /.old-root, which leads nowhere from here).
func TestHasLoaderByMapping(t *testing.T) {
	// The test binary is static: a dynamically linked program's loader.
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	pid := cmd.Process.Pid
	var maps []proc.Mapping
	var m *proc.Mapping
	for range 100 { // until it runs sleep, not the test binary forked
		var err error
		if maps, err = proc.ReadMaps(pid); err != nil {
			t.Fatal(err)
		}
		if m = LoaderMapping(maps); m != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m == nil {
		t.Skip("sleep maps no dynamic loader here")
	}
	id, ok := m.ID()
	if !ok {
		t.Fatalf("loader mapping %+v: no file ID", m)
	}
	var tr Tracer
	if tr.HasLoader(id) {
		t.Fatal("HasLoader before any loader was added")
	}
	// As AttachLoader leaves a loader it attached.
	f := &fileProbe{done: make(chan struct{})}
	close(f.done)
	tr.ldProbes.files = map[proc.FileID]*fileProbe{id: f}
	moved := *m
	moved.Path = "/.old-root" + m.Path
	if id, _ := moved.ID(); !tr.HasLoader(id) {
		t.Errorf("HasLoader of %s, the loader added: false", moved.Path)
	}
}

// AttachLoader from several goroutines at once attaches the loader once:
// one call says it attached, every call has its answer, and none comes
// back before the probe is in. Forgotten, it can be attached again;
// detached, the tracer attaches no more.
func TestAttachLoaderOnce(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	ld := SystemLoader()
	if ld == "" {
		t.Skip("no system dynamic loader here")
	}
	tr, err := New(Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	var st unix.Stat_t
	if err := unix.Stat(ld, &st); err != nil {
		t.Fatal(err)
	}
	id := proc.FileID{Dev: st.Dev, Ino: st.Ino}
	const callers = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	now, ready := 0, 0
	for range callers {
		wg.Go(func() {
			attached, err := tr.AttachLoader(ld)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			defer mu.Unlock()
			if attached {
				now++
			}
			if tr.HasLoader(id) {
				ready++
			}
		})
	}
	wg.Wait()
	links := tr.ldProbes.links()
	if now != 1 || ready != callers || links == 0 || links > 2 {
		t.Errorf("%d callers: %d said attached now (want 1), %d found it in after their call (want %d), %d links", callers, now, ready, callers, links)
	}
	// Forgotten (no process maps it), its probe goes; attached again, a
	// new one.
	end := tr.ForgetLoader(id)
	if tr.HasLoader(id) {
		t.Error("HasLoader after ForgetLoader")
	}
	end()
	if n := tr.ldProbes.links(); n != 0 {
		t.Errorf("%d links after the forgotten loader's end", n)
	}
	if attached, err := tr.AttachLoader(ld); !attached || err != nil || !tr.HasLoader(id) {
		t.Errorf("AttachLoader after ForgetLoader: %v, %v, in %v; want attached now", attached, err, tr.HasLoader(id))
	}
	tr.Detach()
	if attached, err := tr.AttachLoader(ld); attached || err == nil {
		t.Errorf("AttachLoader after Detach: %v, %v; want an error", attached, err)
	}
}

// AttachLoaderFile probes the file it was given, or none: a loader whose
// path names another file by the attach (a container's tree changed
// after the reader read the file) is refused, never probed in its
// place, and the file it names now is not probed either. The reader
// keeps the ID it read (record's probed files), and ends the probe by it.
func TestAttachLoaderFileKeepsItsFile(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	ld := SystemLoader()
	if ld == "" {
		t.Skip("no system dynamic loader here")
	}
	data, err := os.ReadFile(ld)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "ld.so")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	var libs Libraries
	lib, _, err := libs.AddLib(path)
	if err != nil {
		t.Fatal(err)
	}
	// Another file at the path, as a rename leaves it.
	if err := os.WriteFile(path+".new", data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	var now Libraries
	other, _, err := now.AddLib(path)
	if err != nil || other.Inode == lib.Inode {
		t.Fatalf("the file at %s after the rename: %+v, %v; want another inode than %d", path, other, err, lib.Inode)
	}
	tr, err := New(Options{StackWindow: -1})
	if err != nil {
		testenv.SkipOrFail(t, "load BPF: %v", err)
	}
	defer tr.Close()
	attached, err := tr.AttachLoaderFile(lib)
	if attached || err == nil {
		t.Errorf("AttachLoaderFile of a file its path no longer names: attached %v, %v; want refused", attached, err)
	}
	if tr.HasLoader(proc.FileID{Dev: other.Dev, Ino: other.Inode}) {
		t.Error("the file the path names now was probed in its place")
	}
	if n := tr.ldProbes.links(); n != 0 {
		t.Errorf("%d links after the refusal, want 0", n)
	}
}
