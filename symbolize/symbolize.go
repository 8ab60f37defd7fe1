// Package symbolize turns user-space addresses captured in a process into
// function names and source lines, from the process's mappings recorded
// while it ran. The process may be gone by then: the mapped files are opened
// by path on this host, and their build IDs guard against a file that was
// replaced in between. A process in a container names files of its own
// root: they are opened through /proc/PID/root while it lives, and once it
// is gone only a host file or debug file with the same build ID stands in.
package symbolize

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cudatrace/cudatrace/debuginfod"
	"github.com/cudatrace/cudatrace/proc"
	"golang.org/x/sys/unix"
)

// Frame is one symbolized stack frame.
type Frame struct {
	Addr     uint64 // the runtime address as captured
	Function string // demangled function name; "" when unknown
	File     string // source file from DWARF line info; "" when none
	Line     int    // 0 when none
	Module   string // path of the mapped file; "[anon]" / "[vdso]" etc. for non-file mappings, "" if in no mapping
	Offset   uint64 // the address as an ELF virtual address in Module (what addr2line takes); 0 when the file's headers could not be read
	BuildID  string
}

// Symbolizer symbolizes addresses, caching what it parsed from each file.
// It is safe for concurrent use.
type Symbolizer struct {
	// DebugDir is where separate debug files are looked up by build ID
	// (DebugDir/.build-id/ab/cdef….debug), the layout distributions' debug
	// packages install, for files shipped without DWARF. Empty disables it.
	// Set it before the first call to Frames.
	DebugDir string
	// Debuginfod fetches, by build ID, the debug files of files that
	// have neither DWARF nor symbols nor a local debug file (after
	// DebugDir): Debian's and Ubuntu's stripped interpreters and
	// libraries. nil: none (New takes debuginfod.Default, which
	// DEBUGINFOD_URLS turns on). Callers are never the ring buffer's
	// reader: a fetch is bounded by the client's timeout, not instant.
	Debuginfod *debuginfod.Client

	// gone counts frames of processes with their own root, gone by the
	// time they were symbolized, that no file with their build ID named.
	gone atomic.Uint64

	mu sync.Mutex
	// byFile avoids even reading the build ID of a file seen before; the
	// stat fields notice a file rewritten in place under the same path.
	byFile map[fileKey]*entry
	// byBuildID shares one parse between paths holding the same binary
	// (copies, containers' own roots, hard links).
	byBuildID map[string]*module
	// known are frames named by someone who could read the file (the
	// recorder, for a container's process), for when nobody here can.
	known map[knownKey]Frame
}

type knownKey struct {
	buildID string
	off     uint64 // file offset of the address
}

type fileKey struct {
	dev, ino    uint64
	size, mtime int64
}

type entry struct {
	once sync.Once
	mod  *module // nil when the file could not be parsed at all
}

// New returns a Symbolizer with empty caches.
func New() *Symbolizer {
	return &Symbolizer{
		DebugDir:   "/usr/lib/debug",
		Debuginfod: debuginfod.Default(),
		byFile:     map[fileKey]*entry{},
		byBuildID:  map[string]*module{},
		known:      map[knownKey]Frame{},
	}
}

// Known says that in the file with build ID id, file offset off is in
// f.Function at f.File:f.Line, with ELF address f.Offset: what the
// recorder read from a container's own file while the process ran. Frames
// with that build ID and offset take it when no file with the build ID is
// found here.
func (s *Symbolizer) Known(id string, off uint64, f Frame) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.known[knownKey{strings.ToLower(id), off}] = Frame{Function: f.Function, File: f.File, Line: f.Line, Offset: f.Offset}
}

// Close drops the caches. The Symbolizer stays usable: later calls parse
// files again.
func (s *Symbolizer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byFile = map[fileKey]*entry{}
	s.byBuildID = map[string]*module{}
	s.known = map[knownKey]Frame{}
	return nil
}

// Proc says whose mappings a call symbolizes. The zero value is a process
// that sees the tracer's own files.
type Proc struct {
	PID int
	// Start is when it started (CLOCK_BOOTTIME ns, proc.StartTime): PID
	// names the same process only while they match. 0: unknown, and
	// then PID is not trusted to.
	Start uint64
	// OwnRoot: its paths name files of its own root (a container's), not
	// the tracer's (proc.OwnRoot).
	OwnRoot bool
}

// Live reports whether PID still names p (the same start time): its files
// are then reachable through /proc/PID/root.
func (p Proc) Live() bool {
	if p.PID <= 0 || p.Start == 0 {
		return false
	}
	st, err := proc.StartTime(p.PID)
	return err == nil && st == p.Start
}

// FramesOf symbolizes addrs, which are taken to be return addresses,
// against maps of process p. It returns one Frame per address, in order;
// what cannot be found out is left empty. For a process with its own root (a container) the files are its own: while it lives they are
// read through /proc/PID/root; once it is gone, only a file with the build
// ID it mapped (a host file at the same path, a parse cached from when it
// lived, a debug file under DebugDir/.build-id) names its frames. The
// rest keep module, offset and build ID, and are counted (Gone).
//
// A nil Symbolizer (symbolization turned off) names nothing: each Frame
// holds its address only.
func (s *Symbolizer) FramesOf(p Proc, maps []proc.Mapping, addrs []uint64) []Frame {
	if s == nil {
		out := make([]Frame, len(addrs))
		for i, pc := range addrs {
			out[i] = Frame{Addr: pc}
		}
		return out
	}
	sorted := make([]proc.Mapping, len(maps))
	copy(sorted, maps)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Start < sorted[j].Start })

	r := resolver{s: s, mods: map[string]*module{}}
	// A live process's files are opened as it sees them; one with its
	// own root, gone, has none here.
	live := p.Live()
	if live {
		r.pid, r.own = p.PID, p.OwnRoot
	}
	r.gone = p.OwnRoot && !live
	out := make([]Frame, len(addrs))
	for i, addr := range addrs {
		out[i] = r.frame(sorted, addr)
		if r.gone && out[i].Function == "" && strings.HasPrefix(out[i].Module, "/") {
			s.gone.Add(1)
		}
	}
	return out
}

// Gone returns how many frames FramesOf could not name because their
// process, one with its own root, was gone and no file with its build ID
// was found: running while the process lives, or installing debug files
// by build ID, names them.
func (s *Symbolizer) Gone() uint64 { return s.gone.Load() }

// resolver finds the files of one process's mappings for one call.
type resolver struct {
	s *Symbolizer
	// Stat each path once per call, not once per address: stacks hit
	// the same few modules over and over.
	mods map[string]*module
	pid  int  // >0: live, its files opened as it sees them (proc.OpenMapping)
	own  bool // its paths name files of its own root
	gone bool // a process with its own root, gone: its paths name nothing here
}

// module returns the parsed file m maps, nil when none is found that
// holds what the process ran. A live process's file is opened as the
// process sees it (proc.OpenMapping: inside its root, only the very file
// it maps); a gone one's, which sees the tracer's files, at its path
// here (its build ID says whether that is still what it ran).
func (r *resolver) module(m *proc.Mapping) *module {
	if mod, ok := r.mods[m.Path]; ok {
		return mod
	}
	var mod *module
	switch {
	case r.pid > 0:
		mod = r.s.module(proc.RootPath(r.pid, m.Path), func() (*os.File, error) {
			f, err := proc.OpenMapping(r.pid, *m)
			if id, ok := m.ID(); err != nil && !r.own && ok {
				// Gone since: the tracer's file at its path, if it
				// is the very file it mapped.
				f, err = proc.Open(m.Path, &id)
			}
			return f, err
		})
	case r.gone && m.BuildID == "":
		// Nothing tells a host file at the same path from another.
	default:
		mod = r.s.module(m.Path, func() (*os.File, error) { return proc.Open(m.Path, nil) })
	}
	if m.BuildID != "" && (mod == nil || !strings.EqualFold(m.BuildID, mod.buildID)) {
		if byID := r.s.byID(strings.ToLower(m.BuildID)); byID != nil {
			mod = byID
		}
	}
	r.mods[m.Path] = mod
	return mod
}

// byID returns a parse of the binary with build ID id: one cached from
// another path (another container's copy, or this process's own root while
// it lived), else its debug file under DebugDir/.build-id.
func (s *Symbolizer) byID(id string) *module {
	s.mu.Lock()
	mod := s.byBuildID[id]
	s.mu.Unlock()
	if mod != nil || s.DebugDir == "" || len(id) < 3 {
		return mod
	}
	path := filepath.Join(s.DebugDir, ".build-id", id[:2], id[2:]+".debug")
	mod = s.module(path, func() (*os.File, error) { return proc.Open(path, nil) })
	if mod != nil && mod.buildID == id {
		return mod
	}
	// A file gone (a container's, a trace read on another machine) whose
	// debug file a debuginfod server has.
	if path = s.fetchDebugFile(id); path == "" {
		return nil
	}
	mod = s.module(path, func() (*os.File, error) { return proc.Open(path, nil) })
	if mod == nil || mod.buildID != id {
		return nil
	}
	return mod
}

func (r *resolver) frame(maps []proc.Mapping, addr uint64) (f Frame) {
	f.Addr = addr
	defer func() {
		// A malformed file must cost a frame its names, not the caller
		// its process.
		if r := recover(); r != nil {
			notePanic(r)
			f = Frame{Addr: f.Addr, Module: f.Module, BuildID: f.BuildID, Offset: f.Offset}
		}
	}()

	i := proc.Find(maps, addr)
	if i < 0 {
		return f
	}
	m := &maps[i]
	if !strings.HasPrefix(m.Path, "/") {
		f.Module = m.Path
		if f.Module == "" {
			f.Module = "[anon]"
		}
		return f
	}
	f.Module = m.Path
	f.BuildID = m.BuildID

	mod := r.module(m)
	if mod == nil || m.BuildID != "" && !strings.EqualFold(m.BuildID, mod.buildID) {
		// No file, or the file on disk is not what the process ran: its
		// headers, symbols and lines would all describe other code.
		if m.BuildID != "" {
			r.s.mu.Lock()
			k, ok := r.s.known[knownKey{strings.ToLower(m.BuildID), addr - m.Start + m.Offset}]
			r.s.mu.Unlock()
			if ok {
				f.Function, f.File, f.Line, f.Offset = k.Function, k.File, k.Line, k.Offset
			}
		}
		return f
	}
	f.BuildID = mod.buildID
	if f.BuildID == "" {
		f.BuildID = m.BuildID
	}

	vaddr, ok := mod.vaddr(addr-m.Start+m.Offset, m.Exec())
	if !ok {
		vaddr, ok = mod.vaddrInSegment(addr-m.Start, m.Exec())
	}
	if !ok {
		return f
	}
	f.Offset = vaddr
	if vaddr == 0 {
		return f
	}
	// A return address is the instruction after the call; the call itself,
	// one byte back, is in the caller's function and line even when the
	// call was the function's last instruction.
	pc := vaddr - 1
	f.Function = mod.function(pc)
	f.File, f.Line = mod.line(pc)
	return f
}

// module returns the parsed file that open opens (path names it), or nil
// if it cannot be opened or parsed. open never blocks and opens only
// regular files (package proc): a mapped device such as /dev/nvidiactl,
// or a FIFO left at a path, is not opened, let alone read. A file that
// could not be opened is not remembered: the next call tries again. One
// that was is remembered by what it is (device, inode, size, time), not
// by the path that reached it.
func (s *Symbolizer) module(path string, open func() (*os.File, error)) *module {
	f, err := open()
	if err != nil {
		return nil
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil
	}
	key := fileKey{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano()}
	s.mu.Lock()
	e := s.byFile[key]
	if e == nil {
		e = &entry{}
		s.byFile[key] = e
	}
	s.mu.Unlock()
	// Parsing happens outside s.mu so one large library does not stall
	// lookups in others; once makes concurrent callers share the parse.
	e.once.Do(func() { e.mod, _ = s.load(f, path) })
	return e.mod
}

// load parses the open file fd, at path. The module it returns may be
// partial (no symbols, no lines) when only parts of the file are
// readable; the error says what was lost.
func (s *Symbolizer) load(fd *os.File, path string) (mod *module, err error) {
	defer func() {
		if r := recover(); r != nil {
			notePanic(r)
			mod, err = nil, fmt.Errorf("parse %s: panic: %v", path, r)
		}
	}()
	f, err := elf.NewFile(fd)
	if err != nil {
		return nil, fmt.Errorf("read %s as ELF: %w", path, err)
	}

	id, _ := buildIDOf(f)
	if id != "" {
		s.mu.Lock()
		cached := s.byBuildID[id]
		s.mu.Unlock()
		if cached != nil {
			return cached, nil
		}
	}

	mod, err = parseModule(f, path)
	mod.buildID = id
	if !mod.hasLines || len(mod.syms) == 0 {
		if derr := s.addDebugFile(mod, path); derr != nil && err == nil {
			err = derr
		}
	}
	if id != "" {
		s.mu.Lock()
		s.byBuildID[id] = mod
		s.mu.Unlock()
	}
	return mod, err
}

// addDebugFile fills what mod lacks from its separate debug file, if one is
// installed: found by build ID under DebugDir/.build-id, or by the name
// and CRC in the file's .gnu_debuglink next to it, in its .debug/, or
// under DebugDir with its directory (where gdb looks).
func (s *Symbolizer) addDebugFile(mod *module, path string) error {
	var cands []string
	if s.DebugDir != "" && len(mod.buildID) >= 3 {
		cands = append(cands, filepath.Join(s.DebugDir, ".build-id", mod.buildID[:2], mod.buildID[2:]+".debug"))
	}
	if mod.debuglink != "" && !strings.Contains(mod.debuglink, "/") {
		dir := filepath.Dir(path)
		cands = append(cands, filepath.Join(dir, mod.debuglink), filepath.Join(dir, ".debug", mod.debuglink))
		if s.DebugDir != "" {
			cands = append(cands, filepath.Join(s.DebugDir, dir, mod.debuglink))
		}
	}
	for _, cand := range cands {
		if cand == path {
			continue
		}
		ok, err := s.takeDebugFile(mod, cand)
		if ok || err != nil {
			return err
		}
	}
	if cand := s.fetchDebugFile(mod.buildID); cand != "" && cand != path {
		_, err := s.takeDebugFile(mod, cand)
		return err
	}
	return nil
}

// fetchDebugFile is the path of the debug file with build ID id that a
// debuginfod server gave (cached), or "".
func (s *Symbolizer) fetchDebugFile(id string) string {
	if s.Debuginfod == nil || id == "" {
		return ""
	}
	path, err := s.Debuginfod.Debuginfo(context.Background(), id)
	if err != nil {
		return ""
	}
	return path
}

// takeDebugFile takes symbols and lines from the debug file at path when it
// belongs to mod: the same build ID, or for a file without one the CRC its
// .gnu_debuglink names.
func (s *Symbolizer) takeDebugFile(mod *module, path string) (bool, error) {
	f, err := openELF(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, proc.ErrNotRegular) {
		return false, nil // not installed
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	if mod.buildID == "" {
		h := crc32.NewIEEE()
		if _, err := io.Copy(h, io.NewSectionReader(f.OS(), 0, 1<<62)); err != nil || h.Sum32() != mod.debuglinkCRC {
			return false, nil
		}
	}
	if id, _ := buildIDOf(f.File); id != mod.buildID {
		return false, nil
	}
	dbg, err := parseModule(f.File, path)
	// The debug file's own program headers may describe NOBITS sections;
	// only its symbols and lines are worth taking.
	if len(mod.syms) == 0 || (!mod.symtab && dbg.symtab) {
		mod.syms, mod.symtab = dbg.syms, dbg.symtab
	}
	if !mod.hasLines && dbg.hasLines {
		mod.lines, mod.files, mod.hasLines = dbg.lines, dbg.files, true
	}
	return true, err
}

// openELF opens the ELF file at path through proc.Open: never blocking,
// only a regular file, a path under /proc/PID/root resolved inside it.
func openELF(path string) (*proc.ELF, error) { return proc.OpenELF(path, nil) }

// panicHook lets tests see panics that the exported functions recover from.
var panicHook func(any)

func notePanic(r any) {
	if panicHook != nil {
		panicHook(r)
	}
}
