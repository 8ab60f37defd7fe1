package loader

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
