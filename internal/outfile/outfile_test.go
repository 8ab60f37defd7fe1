package outfile

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func write(t *testing.T, path, text string) error {
	t.Helper()
	f, err := Create(path)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Abort()
		t.Fatal(err)
	}
	return f.Commit()
}

func mode(t *testing.T, path string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode()
}

// A FIFO, a link to one, a socket and a directory are refused by Check,
// Create and Open, and left as they were; nothing else is created beside
// them.
func TestRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("fifo", link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{fifo: "a FIFO", link: "a FIFO", sock: "a socket", sub: "a directory"} {
		for name, try := range map[string]func() error{
			"Check":  func() error { return Check(path) },
			"Create": func() error { return write(t, path, "x") },
			"Open": func() error {
				f, err := Open(path)
				if err == nil {
					f.Close()
				}
				return err
			},
		} {
			err := try()
			if err == nil || !strings.Contains(err.Error(), "refusing") || !strings.Contains(err.Error(), kind) {
				t.Errorf("%s(%s) = %v, want a refusal naming %s", name, filepath.Base(path), err, kind)
			}
		}
	}
	if m := mode(t, fifo); m&fs.ModeNamedPipe == 0 {
		t.Errorf("the FIFO is now %v", m)
	}
	if m := mode(t, link); m&fs.ModeSymlink == 0 {
		t.Errorf("the link is now %v", m)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("directory holds %v, want only fifo, link, sock, sub", names)
	}
}

// A link to a file writes the file, and stays a link; an existing file
// keeps its mode; a new one is 0600; a dangling link creates its target.
func TestWrites(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "out.pb.gz")
	if err := os.WriteFile(file, []byte("old"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o640); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink("out.pb.gz", link); err != nil {
		t.Fatal(err)
	}
	if err := write(t, link, "new"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(file); string(b) != "new" {
		t.Errorf("target holds %q, want new", b)
	}
	if m := mode(t, link); m&fs.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", m)
	}
	if m := mode(t, file); m != 0o640 {
		t.Errorf("target mode %v, want -rw-r-----", m)
	}

	fresh := filepath.Join(dir, "fresh.json")
	if err := write(t, fresh, "{}"); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, fresh); m != 0o600 {
		t.Errorf("new file mode %v, want -rw-------", m)
	}

	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink("made.json", dangling); err != nil {
		t.Fatal(err)
	}
	if err := write(t, dangling, "made"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "made.json")); string(b) != "made" {
		t.Errorf("dangling link's target holds %q", b)
	}

	// Open: in place, truncated, mode kept; new ones 0600.
	f, err := Open(link)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("trace")
	f.Close()
	if b, _ := os.ReadFile(file); string(b) != "trace" || mode(t, file) != 0o640 {
		t.Errorf("Open through a link: %q mode %v", b, mode(t, file))
	}
	f, err = Open(filepath.Join(dir, "t.trace"))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if m := mode(t, filepath.Join(dir, "t.trace")); m != 0o600 {
		t.Errorf("new trace mode %v, want -rw-------", m)
	}
}

// Abort leaves the target as it was and no temporary file; a missing
// directory is one clear error from Check.
func TestAbortAndCheck(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "keep")
	os.WriteFile(file, []byte("keep"), 0o600)
	f, err := Create(file)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("half")
	f.Abort()
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Errorf("after Abort the target holds %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("after Abort the directory holds %d entries", len(ents))
	}
	err = Check(filepath.Join(dir, "no", "such", "dir", "x.pb.gz"))
	if err == nil || !strings.Contains(err.Error(), "no such file or directory") || strings.Contains(err.Error(), ".check") {
		t.Errorf("Check of a missing directory = %v", err)
	}
	if err := Check(Stdout); err != nil {
		t.Errorf("Check(-) = %v", err)
	}
	if err := Check(filepath.Join(dir, "new")); err != nil {
		t.Errorf("Check(new file) = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("Check left files behind: %d entries", len(ents))
	}
}
