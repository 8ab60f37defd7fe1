package proc

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A traced process's files are another user's, and hostile: its owner
// can leave a FIFO where its executable or a library it mapped was (open
// blocks until a writer comes), a device node, or a symlink that,
// resolved against the tracer's root rather than the process's, leads to
// a host file. Every reader of a traced process's ELF files, build IDs
// and interpreter layouts opens them here, one way:
//
//   - resolved inside the process's own root: openat2 with
//     RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS from a descriptor of
//     /proc/PID/root (for a process that shares the tracer's root the
//     rule is the ordinary one);
//   - first as an O_PATH descriptor, which opens nothing (no device's
//     open, no FIFO's wait, no inotify event) and whose fstat says what
//     the path reached: only a regular file, and where the caller knows
//     which file it must be (a mapping's device and inode), only that
//     file, is then opened for reading, through /proc/self/fd/N (the
//     kernel resolves that magic link to exactly that inode), with
//     O_RDONLY|O_NONBLOCK|O_NOCTTY|O_CLOEXEC, and checked again.
//
// Nothing here blocks on the file, whatever it is.

// FileID names a file on this host: its device (stat's st_dev) and inode.
type FileID struct {
	Dev, Ino uint64
}

// ID returns the file m maps; ok is false where m names no file or its
// device does not parse.
func (m *Mapping) ID() (id FileID, ok bool) {
	if m.Inode == 0 {
		return FileID{}, false
	}
	major, minor, ok := strings.Cut(m.Dev, ":")
	if !ok {
		return FileID{}, false
	}
	ma, err1 := strconv.ParseUint(major, 16, 32)
	mi, err2 := strconv.ParseUint(minor, 16, 32)
	if err1 != nil || err2 != nil {
		return FileID{}, false
	}
	return FileID{Dev: unix.Mkdev(uint32(ma), uint32(mi)), Ino: m.Inode}, true
}

var (
	// ErrNotRegular: the path reaches something other than a regular
	// file (a FIFO, a device, a directory, a socket); it was not opened.
	ErrNotRegular = errors.New("not a regular file")
	// ErrOtherFile: the path reaches a regular file other than the one
	// the process maps (replaced since, or another tree's); it was not
	// opened.
	ErrOtherFile = errors.New("not the file the process maps")
)

// Open opens the file at path for reading, the safe way (see above): a
// path under Root/PID/root is resolved inside that process's root, any
// other in the tracer's own; only a regular file is opened, and, with
// want, only that file. It never blocks on what the path reaches.
func Open(path string, want *FileID) (*os.File, error) {
	if pid, rel, ok := underRoot(path); ok {
		rootfd, err := openRoot(pid)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		defer unix.Close(rootfd)
		return openAt(rootfd, rel, inRoot, want, path)
	}
	return openAt(unix.AT_FDCWD, path, 0, want, path)
}

// OpenMapping opens the file mapping m of live process pid maps, resolved
// inside pid's root, and only if it is that file (m's device and inode).
// The path /proc/PID/maps shows is written against the tracer's root: a
// process chrooted in the tracer's mount namespace shows the chroot's
// directory in front (that part is taken off and the rest resolved in
// its root), a container its own paths. Where no path reaches the file
// (deleted since it was mapped, and maybe a FIFO or another file left at
// its path: ParseMaps takes " (deleted)" off), it is opened through
// /proc/PID/map_files/, which only CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE may follow (root may, the shipped agent may
// not), else refused with what the path reached.
func OpenMapping(pid int, m Mapping) (*os.File, error) {
	id, ok := m.ID()
	if !ok || !strings.HasPrefix(m.Path, "/") {
		return nil, fmt.Errorf("pid %d: mapping %#x-%#x (%q) names no file", pid, m.Start, m.End, m.Path)
	}
	rootfd, err := openRoot(pid)
	if err != nil {
		return nil, fmt.Errorf("open %s of pid %d: %w", m.Path, pid, err)
	}
	defer unix.Close(rootfd)
	var cands []string
	if link, err := os.Readlink(filepath.Join(Root, strconv.Itoa(pid), "root")); err == nil && link != "/" {
		if rel, ok := strings.CutPrefix(m.Path, strings.TrimSuffix(link, "/")+"/"); ok {
			cands = append(cands, "/"+rel)
		}
	}
	cands = append(cands, m.Path)
	var first error
	for _, c := range cands {
		f, err := openAt(rootfd, c, inRoot, &id, m.Path)
		if err == nil {
			return f, nil
		}
		if first == nil || errors.Is(first, os.ErrNotExist) {
			first = err
		}
	}
	if f, err := openMapFile(pid, m, &id); err == nil {
		return f, nil
	}
	return nil, fmt.Errorf("pid %d: %w", pid, first)
}

// ELF is an ELF file opened by OpenELF or NewELF; Close closes its file.
type ELF struct {
	*elf.File
	f *os.File
}

// Close closes the file.
func (e *ELF) Close() error { return e.f.Close() }

// OS returns the open file (for /proc/self/fd/N: FDPath).
func (e *ELF) OS() *os.File { return e.f }

// NewELF reads f as an ELF file; on error it closes f.
func NewELF(f *os.File) (*ELF, error) {
	ef, err := elf.NewFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("read %s as ELF: %w", f.Name(), err)
	}
	return &ELF{File: ef, f: f}, nil
}

// OpenELF is Open, the file then read as ELF.
func OpenELF(path string, want *FileID) (*ELF, error) {
	f, err := Open(path, want)
	if err != nil {
		return nil, err
	}
	return NewELF(f)
}

// FDPath is a path that reaches exactly the open file f: its descriptor's
// magic link under /proc/self/fd, valid while f is open. What takes a
// path (cilium/ebpf's link.OpenExecutable, the kernel's uprobe attach)
// is given this one, never a traced process's path again.
func FDPath(f *os.File) string { return "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) }

const inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// underRoot splits a path under Root/PID/root into the PID and the path
// inside that root.
func underRoot(path string) (pid int, rel string, ok bool) {
	// Not cleaned first: a ".." after the root is resolved inside it.
	rest, ok := strings.CutPrefix(path, strings.TrimSuffix(Root, "/")+"/")
	if !ok {
		return 0, "", false
	}
	num, rest, _ := strings.Cut(rest, "/")
	pid, err := strconv.Atoi(num)
	if err != nil || pid <= 0 {
		return 0, "", false
	}
	if rest != "root" && !strings.HasPrefix(rest, "root/") {
		return 0, "", false
	}
	return pid, "/" + strings.TrimPrefix(strings.TrimPrefix(rest, "root"), "/"), true
}

// openRoot opens a descriptor of pid's root directory (the magic link
// /proc/PID/root followed: the process's own root and mounts).
func openRoot(pid int) (int, error) {
	p := filepath.Join(Root, strconv.Itoa(pid), "root")
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, wrapNotExist(pid, &os.PathError{Op: "open", Path: p, Err: err})
	}
	return fd, nil
}

// openMapFile opens mapping m's file through /proc/PID/map_files/, which
// the kernel lets only CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) follow.
func openMapFile(pid int, m Mapping, want *FileID) (*os.File, error) {
	p := filepath.Join(Root, strconv.Itoa(pid), "map_files", fmt.Sprintf("%x-%x", m.Start, m.End))
	return openAt(unix.AT_FDCWD, p, 0, want, p)
}

// openAt resolves path from dirfd with resolve as an O_PATH descriptor,
// checks what it reached, and only then opens that for reading. name is
// what errors call it.
func openAt(dirfd int, path string, resolve uint64, want *FileID, name string) (*os.File, error) {
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolve}
	var fd int
	var err error
	for range 8 {
		// EAGAIN: a rename raced a RESOLVE_IN_ROOT lookup's "..".
		if fd, err = unix.Openat2(dirfd, path, &how); err != unix.EAGAIN && err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &os.PathError{Op: "stat", Path: name, Err: err}
	}
	if err := check(fd, &st, want); err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	rfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: name, Err: err}
	}
	var rst unix.Stat_t
	if err := unix.Fstat(rfd, &rst); err != nil || rst.Dev != st.Dev || rst.Ino != st.Ino || rst.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(rfd)
		return nil, fmt.Errorf("open %s: reopened descriptor is another file", name)
	}
	return os.NewFile(uintptr(rfd), name), nil
}

// check says whether st, of descriptor fd, is a regular file and, with
// want, that file. A file of an overlay file system (a container's
// image) is stat'ed with the overlay's device while /proc/PID/maps shows
// the layer's: there the inode alone must agree.
func check(fd int, st *unix.Stat_t, want *FileID) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w (mode %#o)", ErrNotRegular, st.Mode&unix.S_IFMT)
	}
	if want == nil || st.Dev == want.Dev && st.Ino == want.Ino {
		return nil
	}
	if st.Ino == want.Ino {
		var fs unix.Statfs_t
		if unix.Fstatfs(fd, &fs) == nil && fs.Type == unix.OVERLAYFS_SUPER_MAGIC {
			return nil
		}
	}
	return fmt.Errorf("%w (device %d:%d inode %d, the mapping's %d:%d inode %d)", ErrOtherFile,
		unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino, unix.Major(want.Dev), unix.Minor(want.Dev), want.Ino)
}
