package procmodel

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
)

// TestBuildIDsRetry: a file that could not be read (its process gone,
// nothing yet at its path here) is not remembered as having no build ID:
// once it can be read, its build ID is read.
func TestBuildIDsRetry(t *testing.T) {
	src := "/bin/true"
	want, err := symbolize.BuildID(src)
	if err != nil || want == "" {
		t.Skipf("%s has no build ID (%v)", src, err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path, tmp := filepath.Join(dir, "libx.so"), filepath.Join(dir, "tmp")
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		t.Fatal(err)
	}
	m := proc.Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: path, Inode: st.Ino,
		Dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))}
	const gone = 1<<22 + 7 // above any pid_max: no such process
	var ids BuildIDs
	if got := ids.Of(gone, m); got != "" {
		t.Fatalf("Of before the file is at its path = %q", got)
	}
	if got := ids.OfFile(m); got != "" {
		t.Fatalf("OfFile before the file is at its path = %q", got)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if got := ids.Of(gone, m); got != want {
		t.Errorf("Of once the file can be read = %q, want %q", got, want)
	}
	var ids2 BuildIDs
	ids2.OfFile(proc.Mapping{Path: filepath.Join(dir, "none"), Dev: m.Dev, Inode: m.Inode})
	m2 := m
	m2.Path = filepath.Join(dir, "none")
	if err := os.Link(path, m2.Path); err != nil {
		t.Fatal(err)
	}
	if got := ids2.OfFile(m2); got != want {
		t.Errorf("OfFile once the file can be read = %q, want %q", got, want)
	}
	// Another file at the path than the one mapped is not read.
	other := m
	other.Inode++
	var ids3 BuildIDs
	if got := ids3.Of(gone, other); got != "" {
		t.Errorf("Of another file at the mapping's path = %q, want \"\"", got)
	}
}
