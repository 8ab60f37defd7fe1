package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	if len(tr.links) != 0 || len(tr.loaders.List()) != 0 {
		t.Errorf("a refused loader left %d links and %d loaders", len(tr.links), len(tr.loaders.List()))
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
	if _, err := tr.loaders.Add(LoaderIn(pid, maps)); err != nil {
		t.Fatal(err)
	}
	moved := *m
	moved.Path = "/.old-root" + m.Path
	if id, _ := moved.ID(); !tr.HasLoader(id) {
		t.Errorf("HasLoader of %s, the loader added: false", moved.Path)
	}
}
