// Package proc reads what the kernel tells about a process: its memory
// mappings, command name and command line. It is a leaf: the loader uses it
// to find CUDA libraries in a target, the recorder to capture what
// symbolization needs before the process exits (package procmodel).
// docs/architecture.md places it among the other packages.
package proc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Root is where /proc is mounted; tests point it elsewhere.
var Root = "/proc"

// Mapping is one line of /proc/PID/maps, plus the build ID of the mapped file
// when the recorder could read it. It is an in-memory type: the trace file
// records mappings as tracefile.Mapping.
type Mapping struct {
	Start   uint64
	End     uint64
	Offset  uint64 // file offset of Start
	Perms   string
	Dev     string // major:minor, hex, as the kernel prints it
	Inode   uint64
	Path    string
	BuildID string // hex GNU build ID of Path
}

// Exec reports whether the mapping is executable (the only ones return
// addresses fall in).
func (m *Mapping) Exec() bool { return len(m.Perms) > 2 && m.Perms[2] == 'x' }

// File reports whether the mapping is backed by a file on disk, rather than
// anonymous memory or a kernel pseudo-mapping such as [vdso].
func (m *Mapping) File() bool { return m.Inode != 0 && strings.HasPrefix(m.Path, "/") }

// ErrNoProcess says the PID does not exist (or has exited).
var ErrNoProcess = errors.New("no such process")

func path(pid int, name string) string {
	return filepath.Join(Root, strconv.Itoa(pid), name)
}

func wrapNotExist(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errESRCH) {
		return fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// Exists reports whether pid is a live process.
func Exists(pid int) bool {
	_, err := os.Stat(filepath.Join(Root, strconv.Itoa(pid)))
	return err == nil
}

// ReadMaps reads /proc/PID/maps.
func ReadMaps(pid int) ([]Mapping, error) {
	f, err := os.Open(path(pid, "maps"))
	if err != nil {
		return nil, wrapNotExist(pid, err)
	}
	defer f.Close()
	maps, err := ParseMaps(f)
	if err != nil {
		return nil, wrapNotExist(pid, err)
	}
	return maps, nil
}

// ParseMaps parses the text of a /proc/PID/maps file. Malformed lines are an
// error: the format is the kernel's and does not vary.
func ParseMaps(r io.Reader) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		m, err := parseMapsLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("maps line %d: %w", n, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func parseMapsLine(line string) (Mapping, error) {
	// 7f1c2a000000-7f1c2a021000 r-xp 00000000 fd:01 1234   /usr/lib/x.so
	var m Mapping
	fields := strings.Fields(line)
	if len(fields) < 5 {
		return m, fmt.Errorf("want at least 5 fields in %q", line)
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	if !ok {
		return m, fmt.Errorf("bad range %q", fields[0])
	}
	var err error
	if m.Start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return m, fmt.Errorf("bad start %q", lo)
	}
	if m.End, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return m, fmt.Errorf("bad end %q", hi)
	}
	m.Perms = fields[1]
	if m.Offset, err = strconv.ParseUint(fields[2], 16, 64); err != nil {
		return m, fmt.Errorf("bad offset %q", fields[2])
	}
	m.Dev = fields[3]
	if m.Inode, err = strconv.ParseUint(fields[4], 10, 64); err != nil {
		return m, fmt.Errorf("bad inode %q", fields[4])
	}
	if len(fields) > 5 {
		// The path is the rest of the line after the fifth field and may
		// hold spaces (or look like an earlier field).
		rest := line
		for range 5 {
			rest = strings.TrimLeft(rest, " \t")
			rest = rest[strings.IndexAny(rest+" ", " \t"):]
		}
		m.Path = strings.TrimSuffix(strings.TrimLeft(rest, " \t"), " (deleted)")
	}
	return m, nil
}

// Comm returns the process's command name (/proc/PID/comm).
func Comm(pid int) (string, error) {
	b, err := os.ReadFile(path(pid, "comm"))
	if err != nil {
		return "", wrapNotExist(pid, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// Cmdline returns the process's arguments (/proc/PID/cmdline). A process
// that wrote a title over its arguments (setproctitle: libcenv.go) shows
// the title, padded with NULs to the length of the arguments: the padding
// is dropped (and with it empty arguments at the end of a command line
// left as it started, which nothing tells apart from padding). What it
// started with is not in its memory any more: procmodel keeps the first
// command line it read of a process.
func Cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(path(pid, "cmdline"))
	if err != nil {
		return nil, wrapNotExist(pid, err)
	}
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil, nil
	}
	return strings.Split(string(b), "\x00"), nil
}

// PPID returns the parent's PID, from /proc/PID/stat.
func PPID(pid int) (int, error) {
	f, err := statFields(pid, 2)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// statFields returns /proc/PID/stat's fields from the third (state) on,
// at least min of them. The comm field before them is in parentheses and
// may contain anything: the fields are those after the last ')'.
func statFields(pid, min int) ([]string, error) {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return nil, wrapNotExist(pid, err)
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("pid %d: malformed stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < min {
		return nil, fmt.Errorf("pid %d: malformed stat", pid)
	}
	return f, nil
}

// Find returns the index of the mapping of maps (sorted by Start, as
// /proc/PID/maps lists them) that holds addr, -1 when none does.
func Find(maps []Mapping, addr uint64) int {
	i := sort.Search(len(maps), func(i int) bool { return maps[i].End > addr })
	if i == len(maps) || addr < maps[i].Start {
		return -1
	}
	return i
}

// RootPath returns the path by which the tracer sees file p of process pid:
// through /proc/PID/root, so a container's files resolve in its own mount
// namespace.
func RootPath(pid int, p string) string {
	return filepath.Join(Root, strconv.Itoa(pid), "root", p)
}

// PIDs lists every process now running.
func PIDs() ([]int, error) {
	ents, err := os.ReadDir(Root)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", Root, err)
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Alive reports whether pid runs: it exists and is not a zombie waiting to
// be reaped.
func Alive(pid int) bool {
	b, err := os.ReadFile(path(pid, "stat"))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// userHZ is the unit of /proc/PID/stat's times: USER_HZ, 100 on every
// architecture Linux runs cudatrace on (the kernel reports in it whatever
// its own HZ).
const userHZ = 100

// StartTimeTick is StartTime's precision: a start time is rounded down to
// it, so a process that started within a tick before some moment may read
// as started at or after it.
const StartTimeTick = time.Second / userHZ

// StartTime returns when pid started, in CLOCK_BOOTTIME nanoseconds at
// USER_HZ precision (10 ms), from /proc/PID/stat. A PID and its start time
// name a process for good: PIDs are reused, the pair is not.
func StartTime(pid int) (uint64, error) {
	f, err := statFields(pid, 20)
	if err != nil {
		return 0, err
	}
	return startOf(pid, f)
}

// startOf is StartTime from pid's stat fields (after the comm).
func startOf(pid int, f []string) (uint64, error) {
	// Field 22 of stat; the first after ')' is field 3.
	ticks, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("pid %d: malformed stat: starttime %q", pid, f[19])
	}
	return ticks * (1e9 / userHZ), nil
}

// Running says whether pid runs as the process that started at start
// (StartTime's ns; 0: whichever): not gone, not a zombie (exited, its
// stat reading on with its start until its parent reaps it), and not
// another process given the PID since. One read of its stat.
func Running(pid int, start uint64) bool {
	f, err := statFields(pid, 20)
	if err != nil || f[0] == "Z" || f[0] == "X" {
		return false
	}
	if start == 0 {
		return true
	}
	st, err := startOf(pid, f)
	return err == nil && st == start
}

// OwnRoot reports whether pid's mappings name files of a tree of its own:
// their paths (as /proc/PID/maps gives them) reach its files only through
// RootPath while it lives, not through the tracer's own root. The kernel
// writes those paths against the reader's root: a process in another
// mount namespace (a container: docker, containerd and Kubernetes
// pivot_root into it, after which /proc/PID/root still reads "/") shows
// its own paths, while a process chrooted in the tracer's namespace shows
// paths that the tracer's root reaches (/srv/root/usr/bin/python3), which
// through RootPath would lead nowhere. So the answer comes from the files
// themselves: a mapping's device and inode, found under one root and not
// the other. Where no mapping tells (files on overlayfs, whose mappings
// may show the layer's device: DESIGN.md), a process in another mount
// namespace or under another root has its own tree.
func OwnRoot(pid int) (bool, error) {
	maps, err := ReadMaps(pid)
	if err != nil {
		return false, err
	}
	return OwnRootOf(pid, maps)
}

// RootDir is where the paths process pid sees are opened from here: ""
// where they name the tracer's own files, RootPath(pid, "/") where the
// process has a tree of its own (OwnRootOf; maps are its mappings, nil
// to read them now).
func RootDir(pid int, maps []Mapping) (string, error) {
	var own bool
	var err error
	if maps == nil {
		own, err = OwnRoot(pid)
	} else {
		own, err = OwnRootOf(pid, maps)
	}
	if err != nil || !own {
		return "", err
	}
	return RootPath(pid, "/"), nil
}

// OwnRootOf is OwnRoot with pid's mappings already read.
func OwnRootOf(pid int, maps []Mapping) (bool, error) {
	tried := 0
	for i := range maps {
		m := &maps[i]
		if !m.File() || tried == ownRootTries {
			continue
		}
		tried++
		ours, theirs := sameFile(m.Path, m), sameFile(RootPath(pid, m.Path), m)
		if ours != theirs {
			return theirs, nil
		}
	}
	theirs, err := os.Readlink(filepath.Join(Root, strconv.Itoa(pid), "ns", "mnt"))
	if err != nil {
		return false, wrapNotExist(pid, err)
	}
	ours, err := os.Readlink(filepath.Join(Root, "self", "ns", "mnt"))
	if err != nil {
		return false, err
	}
	if theirs != ours {
		return true, nil
	}
	root, err := os.Readlink(filepath.Join(Root, strconv.Itoa(pid), "root"))
	if err != nil {
		return false, wrapNotExist(pid, err)
	}
	return root != "/", nil
}

// ownRootTries bounds the mappings OwnRootOf looks at: the first that
// tells settles it; most do.
const ownRootTries = 8

// FilePath returns the path by which the tracer opens the file that
// mapping m of process pid maps: its own path where that reaches the
// file (the tracer's files, a chroot's), else through /proc/PID/root (a
// container's). maps are pid's mappings, m among them: where neither
// path shows the file (overlayfs), they tell whose tree it is (OwnRootOf).
func FilePath(pid int, m Mapping, maps []Mapping) string {
	if sameFile(m.Path, &m) {
		return m.Path
	}
	if in := RootPath(pid, m.Path); sameFile(in, &m) {
		return in
	}
	if own, err := OwnRootOf(pid, maps); err == nil && own {
		return RootPath(pid, m.Path)
	}
	return m.Path
}

// sameFile reports whether path is the file mapping m maps: the same
// device (maps' major:minor, hex) and inode.
func sameFile(path string, m *Mapping) bool {
	var st unix.Stat_t
	if m.Inode == 0 || unix.Stat(path, &st) != nil || st.Ino != m.Inode {
		return false
	}
	major, minor, ok := strings.Cut(m.Dev, ":")
	if !ok {
		return false
	}
	ma, err1 := strconv.ParseUint(major, 16, 32)
	mi, err2 := strconv.ParseUint(minor, 16, 32)
	return err1 == nil && err2 == nil && uint64(unix.Major(st.Dev)) == ma && uint64(unix.Minor(st.Dev)) == mi
}
