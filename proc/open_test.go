package proc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// prompt runs open and fails the test if it has not returned within a
// few seconds: an open that waits for a FIFO's writer would block for
// ever.
func prompt(t *testing.T, open func() (*os.File, error)) (*os.File, error) {
	t.Helper()
	type res struct {
		f   *os.File
		err error
	}
	ch := make(chan res, 1)
	go func() {
		f, err := open()
		ch <- res{f, err}
	}()
	select {
	case r := <-ch:
		if r.f != nil {
			t.Cleanup(func() { r.f.Close() })
		}
		return r.f, r.err
	case <-time.After(5 * time.Second):
		t.Fatal("open blocked for 5 s")
		return nil, nil
	}
}

// mappingOf is a mapping of the file at path, as /proc/PID/maps would
// show it.
func mappingOf(t *testing.T, path string) Mapping {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return Mapping{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: path, Inode: st.Ino,
		Dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev))}
}

// fakeRoot points Root at a temporary /proc whose process 42's root is a
// directory of the test's: it returns that root.
func fakeRoot(t *testing.T) string {
	t.Helper()
	old := Root
	Root = t.TempDir()
	t.Cleanup(func() { Root = old })
	root := filepath.Join(Root, "42", "root")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func content(t *testing.T, f *os.File) string {
	t.Helper()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestOpenRegular(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lib.so")
	write(t, p, "ELF")
	f, err := prompt(t, func() (*os.File, error) { return Open(p, nil) })
	if err != nil {
		t.Fatal(err)
	}
	if got := content(t, f); got != "ELF" {
		t.Errorf("read %q", got)
	}
	if fl, _ := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); fl&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("flags %#x: not read-only", fl)
	}
	m := mappingOf(t, p)
	id, _ := m.ID()
	if _, err := prompt(t, func() (*os.File, error) { return Open(p, &id) }); err != nil {
		t.Errorf("Open with its own ID: %v", err)
	}
}

func TestOpenFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "python3")
	if err := unix.Mkfifo(p, 0o666); err != nil {
		t.Fatal(err)
	}
	_, err := prompt(t, func() (*os.File, error) { return Open(p, nil) })
	if !errors.Is(err, ErrNotRegular) {
		t.Errorf("Open(FIFO) = %v, want ErrNotRegular", err)
	}
	// A mapped file deleted and a FIFO left at its path (and at the
	// path with " (deleted)", which is not where the file was).
	if err := unix.Mkfifo(p+" (deleted)", 0o666); err != nil {
		t.Fatal(err)
	}
	m := mappingOf(t, "/proc/self/exe")
	m.Path = p
	id, _ := m.ID()
	_, err = prompt(t, func() (*os.File, error) { return Open(p, &id) })
	if !errors.Is(err, ErrNotRegular) {
		t.Errorf("Open(FIFO, want) = %v, want ErrNotRegular", err)
	}
	_, err = prompt(t, func() (*os.File, error) { return OpenMapping(os.Getpid(), m) })
	if err == nil {
		t.Errorf("OpenMapping of a FIFO opened it")
	}
}

func TestOpenDevice(t *testing.T) {
	for _, p := range []string{"/dev/null", "/dev/zero", "/dev/tty"} {
		_, err := prompt(t, func() (*os.File, error) { return Open(p, nil) })
		if err == nil || errors.Is(err, os.ErrNotExist) {
			continue
		}
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("Open(%s) = %v, want ErrNotRegular", p, err)
		}
	}
	if _, err := prompt(t, func() (*os.File, error) { return Open("/dev/null", nil) }); !errors.Is(err, ErrNotRegular) {
		t.Errorf("Open(/dev/null) = %v", err)
	}
	if _, err := prompt(t, func() (*os.File, error) { return Open(t.TempDir(), nil) }); !errors.Is(err, ErrNotRegular) {
		t.Errorf("Open(a directory) = %v", err)
	}
}

// TestOpenInRoot: a symlink in a process's root to an absolute path is
// resolved in that root, never the tracer's; so is "..".
func TestOpenInRoot(t *testing.T) {
	host := filepath.Join(t.TempDir(), "secret")
	write(t, host, "host")
	root := fakeRoot(t)
	if err := os.MkdirAll(filepath.Join(root, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(root, "lib", "libx.so")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../../.."+host, filepath.Join(root, "lib", "liby.so")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/proc/self/root"+host, filepath.Join(root, "lib", "libz.so")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(Root, "42", "root", "lib", "libx.so")
	for _, name := range []string{"libx.so", "liby.so", "libz.so"} {
		p := filepath.Join(Root, "42", "root", "lib", name)
		if f, err := prompt(t, func() (*os.File, error) { return Open(p, nil) }); err == nil {
			t.Errorf("Open(%s) opened %q: the host's file", name, content(t, f))
		}
	}
	if f, err := prompt(t, func() (*os.File, error) { return Open(p+"/../../../../../../.."+host, nil) }); err == nil {
		t.Errorf("Open(.. out of the root) opened %q", content(t, f))
	}
	// Where the root has a file at the symlink's target, that one.
	write(t, filepath.Join(root, host), "theirs")
	for _, name := range []string{"libx.so", "liby.so"} {
		p := filepath.Join(Root, "42", "root", "lib", name)
		f, err := prompt(t, func() (*os.File, error) { return Open(p, nil) })
		if err != nil {
			t.Fatalf("Open(%s): %v", name, err)
		}
		if got := content(t, f); got != "theirs" {
			t.Errorf("Open(%s) read %q, want the root's own file", name, got)
		}
	}
	// The same through OpenMapping: the process's path resolved in its
	// root.
	m := mappingOf(t, filepath.Join(root, host))
	m.Path = "/lib/libx.so"
	f, err := prompt(t, func() (*os.File, error) { return OpenMapping(42, m) })
	if err != nil {
		t.Fatalf("OpenMapping: %v", err)
	}
	if got := content(t, f); got != "theirs" {
		t.Errorf("OpenMapping read %q", got)
	}
	hm := mappingOf(t, host)
	hm.Path = "/lib/libx.so"
	if f, err := prompt(t, func() (*os.File, error) { return OpenMapping(42, hm) }); err == nil {
		t.Errorf("OpenMapping of the host file's mapping opened %q", content(t, f))
	}
}

// TestOpenOtherFile: a regular file at the mapping's path that is not the
// file it maps (replaced since) is not opened.
func TestOpenOtherFile(t *testing.T) {
	root := fakeRoot(t)
	p := filepath.Join(root, "usr", "lib", "libcudart.so.12")
	write(t, p, "old")
	m := mappingOf(t, p)
	m.Path = "/usr/lib/libcudart.so.12"
	f, err := prompt(t, func() (*os.File, error) { return OpenMapping(42, m) })
	if err != nil {
		t.Fatalf("OpenMapping: %v", err)
	}
	if got := content(t, f); got != "old" {
		t.Errorf("read %q", got)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	write(t, p+".new", "new")
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
	_, err = prompt(t, func() (*os.File, error) { return OpenMapping(42, m) })
	if !errors.Is(err, ErrOtherFile) {
		t.Errorf("OpenMapping of a replaced file = %v, want ErrOtherFile", err)
	}
	id, _ := m.ID()
	_, err = prompt(t, func() (*os.File, error) { return Open(p, &id) })
	if !errors.Is(err, ErrOtherFile) {
		t.Errorf("Open of a replaced file = %v, want ErrOtherFile", err)
	}
	// A device node with the mapping's inode number is still not opened.
	if _, err := prompt(t, func() (*os.File, error) { return OpenMapping(42, Mapping{Path: "/dev/null", Dev: "00:05", Inode: 4}) }); err == nil {
		t.Error("OpenMapping(/dev/null) opened it")
	}
}

// TestOpenMappingSelf opens this process's own executable mapping, and
// its chrooted-path form: the part of the path that is the process's
// root (as /proc/PID/root reads) is taken off.
func TestOpenMappingSelf(t *testing.T) {
	maps, err := ReadMaps(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Readlink("/proc/self/exe")
	for _, m := range maps {
		if m.Path != exe || !m.Exec() {
			continue
		}
		f, err := prompt(t, func() (*os.File, error) { return OpenMapping(os.Getpid(), m) })
		if err != nil {
			t.Fatalf("OpenMapping(self %s): %v", m.Path, err)
		}
		e, err := NewELF(f)
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
		return
	}
	t.Fatalf("no executable mapping of %s in %v", exe, maps)
}

func TestUnderRoot(t *testing.T) {
	for _, c := range []struct {
		path string
		pid  int
		rel  string
		ok   bool
	}{
		{"/proc/12/root/usr/lib/x.so", 12, "/usr/lib/x.so", true},
		{"/proc/12/root", 12, "/", true},
		{"/proc/12/root/../../etc", 12, "/../../etc", true},
		{"/proc/12/rootfs/x", 0, "", false},
		{"/proc/self/root/x", 0, "", false},
		{"/usr/lib/x.so", 0, "", false},
	} {
		pid, rel, ok := underRoot(c.path)
		if pid != c.pid || rel != c.rel || ok != c.ok {
			t.Errorf("underRoot(%q) = %d %q %v, want %d %q %v", c.path, pid, rel, ok, c.pid, c.rel, c.ok)
		}
	}
	if !strings.HasPrefix(FDPath(os.Stdin), "/proc/self/fd/") {
		t.Error(FDPath(os.Stdin))
	}
}
