// Package outfile writes cudatrace's output files (traces, exports) only
// where a regular file may be written. It is the one place that decides
// what an output path may replace:
//
//   - "-" is standard output, never a file (callers handle it);
//   - a symbolic link is followed: the user named the link to write the
//     file it points to (which may not exist yet), not to replace the link;
//   - an existing device, FIFO, socket or directory is refused with one
//     line: writing there would block, fill a device or replace a node;
//   - an existing regular file keeps its mode (and, as root, its owner);
//     a new file is created 0600, since outputs hold command lines, stacks
//     and memory layouts, as the agent's OOM dumps do.
//
// Check runs before tracing starts, so that a bad path costs nothing;
// Create writes under a temporary name beside the target and renames it
// over the target once complete (a failed export never leaves half a
// file); Open writes in place (a trace, readable up to its last complete
// record if the tracer is killed).
package outfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/hint"
)

// Stdout is the path that means standard output.
const Stdout = "-"

// NewMode is the mode of a file an output creates.
const NewMode = 0o600

// maxLinks bounds a chain of symbolic links, as the kernel's ELOOP does.
const maxLinks = 40

const refuseHint = "name a regular file (it is replaced) or a new one; -o - writes to standard output"

// Resolve follows path's symbolic links to the file an output writes, and
// returns it with its FileInfo (nil when it does not exist yet). A
// device, FIFO, socket or directory there is an error.
func Resolve(path string) (string, fs.FileInfo, error) {
	p := path
	for range maxLinks {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return p, nil, nil
		}
		if err != nil {
			return "", nil, fmt.Errorf("output %s: %w", path, err)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			if err := regular(path, p, fi); err != nil {
				return "", nil, err
			}
			return p, fi, nil
		}
		dest, err := os.Readlink(p)
		if err != nil {
			return "", nil, fmt.Errorf("output %s: %w", path, err)
		}
		if !filepath.IsAbs(dest) {
			dest = filepath.Join(filepath.Dir(p), dest)
		}
		p = dest
	}
	return "", nil, fmt.Errorf("output %s: %w", path, syscall.ELOOP)
}

// regular refuses what an output must not replace.
func regular(path, target string, fi fs.FileInfo) error {
	var kind string
	switch m := fi.Mode(); {
	case m.IsRegular():
		return nil
	case m.IsDir():
		kind = "a directory"
	case m&fs.ModeNamedPipe != 0:
		kind = "a FIFO"
	case m&fs.ModeSocket != 0:
		kind = "a socket"
	case m&fs.ModeCharDevice != 0:
		kind = "a character device"
	case m&fs.ModeDevice != 0:
		kind = "a block device"
	default:
		kind = "not a regular file"
	}
	what := path
	if target != path {
		what = fmt.Sprintf("%s (a link to %s)", path, target)
	}
	return hint.Wrap(fmt.Errorf("refusing to write output to %s: it is %s", what, kind), refuseHint)
}

// Check says whether path can take an output, before anything is traced:
// what Resolve says, and that a file can be created in its directory (it
// exists, may be written, its file system is not read-only). It creates
// nothing that stays.
func Check(path string) error {
	if path == Stdout {
		return nil
	}
	target, fi, err := Resolve(path)
	if err != nil {
		return err
	}
	// A trace is written in place (Open): the file itself must take it.
	if fi != nil {
		if err := unix.Access(target, unix.W_OK); err != nil {
			return hint.Wrap(fmt.Errorf("cannot write output %s: %w", path, err), "check the file's permissions")
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".check*")
	if err != nil {
		return hint.Wrap(fmt.Errorf("cannot write output %s: %w", path, unwrapPath(err)), "check that its directory exists and can be written")
	}
	tmp.Close()
	os.Remove(tmp.Name())
	return nil
}

// unwrapPath drops the temporary name from a PathError: the user named
// the output, not the probe file.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// File is an output written under a temporary name in its target's
// directory. Commit renames it over the target; Abort removes it.
type File struct {
	*os.File
	target string
	path   string // as the user gave it
	keep   fs.FileInfo
	done   bool
}

// Create starts writing the output path (not "-"): see the package comment.
func Create(path string) (*File, error) {
	target, fi, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".*")
	if err != nil {
		return nil, hint.Wrap(fmt.Errorf("cannot write output %s: %w", path, unwrapPath(err)), "check that its directory exists and can be written")
	}
	return &File{File: tmp, target: target, path: path, keep: fi}, nil
}

// Commit closes the file and renames it over the target, with the mode
// (and owner) of the file it replaces, or NewMode.
func (f *File) Commit() error {
	if f.done {
		return errors.New("outfile: committed twice")
	}
	f.done = true
	err := f.File.Sync()
	if err == nil && f.keep != nil {
		err = f.File.Chmod(f.keep.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky))
		if st, ok := f.keep.Sys().(*syscall.Stat_t); ok && err == nil && os.Geteuid() == 0 {
			f.File.Chown(int(st.Uid), int(st.Gid)) // best effort
		}
	}
	if cerr := f.File.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.File.Name(), f.target)
	}
	if err != nil {
		os.Remove(f.File.Name())
		return fmt.Errorf("write %s: %w", f.path, err)
	}
	return nil
}

// Abort discards what was written; after Commit it does nothing.
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.File.Close()
	os.Remove(f.File.Name())
}

// Open creates or truncates the output path (not "-") to write it in
// place, after the same refusals as Create: an existing regular file keeps
// its mode, a new one is NewMode. The descriptor is checked after opening
// (without blocking: a FIFO put there since would block an open for
// writing), so a swap between the check and the open is refused too.
func Open(path string) (*os.File, error) {
	target, fi, err := Resolve(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(target, unix.O_WRONLY|unix.O_CREAT|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, NewMode)
	if err != nil {
		return nil, hint.Wrap(fmt.Errorf("cannot write output %s: %w", path, err), "check that its directory exists and can be written")
	}
	f := os.NewFile(uintptr(fd), target)
	now, err := f.Stat()
	if err == nil {
		err = regular(path, target, now)
	}
	if err == nil && fi != nil && !os.SameFile(fi, now) {
		err = fmt.Errorf("output %s changed while it was opened", path)
	}
	if err == nil {
		err = f.Truncate(0)
	}
	if err == nil {
		// Back to blocking writes: the rest of the program expects them.
		var flags int
		if flags, err = unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err == nil {
			_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, flags&^unix.O_NONBLOCK)
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
