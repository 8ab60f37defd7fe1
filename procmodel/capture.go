// Package procmodel is what cudatrace knows about each traced process: its
// captures over time (mappings with build IDs, whether it has a root of its
// own, command line, container), its CPython frame table, and which capture
// each of its stacks is read against. It is the one owner of that state for
// the live session (record), its observers (top, agent) and the replay of a
// trace (report, export), and the one place that turns a stack into named
// frames. Its types are in-memory ones: the trace file's shapes live in
// package tracefile, and file.go converts between them at the file's edge.
//
// docs/architecture.md places it among the other packages.
package procmodel

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/container"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Capture is one reading of a live process: what symbolizing and
// unwinding its stacks needs, taken while it runs, because it may be gone
// by the time anyone reads the trace. A Capture is never changed once
// made: the live views share it across goroutines.
type Capture struct {
	PID     uint32
	PPID    int
	Comm    string
	Cmdline []string
	Exe     string
	Time    uint64 // when captured (CLOCK_BOOTTIME ns)
	// Start is when the process started (CLOCK_BOOTTIME ns, 10 ms
	// precision): a PID that names another process later has another.
	// 0: unknown.
	Start uint64
	Maps  []proc.Mapping // executable file mappings, with build IDs
	Root  string         // where /proc/PID/root points, when not "/"
	// OwnRoot: the process saw another file tree than the tracer
	// (another mount namespace, as a container, or a chroot): the paths
	// in Maps name its files, reached through /proc/PID/root while it
	// lives.
	OwnRoot bool
	// The container and Kubernetes pod it runs in (package container);
	// empty on the host.
	Container, Pod string
	Error          string // why the capture is incomplete (the process exited first)
	// Job is its place in a distributed job (job and rank), read once
	// from its environment (identity.go); nil when it is in none or its
	// environment could not be read, JobError then saying why.
	Job      *jobid.Identity
	JobError string
	// Node is the host it ran on, set in a merged trace only (a trace of
	// one host has it in its meta); NodePID its PID there, where the
	// merge numbered it otherwise (two nodes had the PID).
	Node    string
	NodePID uint32
}

// Symbol says whose files c's mappings name, for symbolize.FramesOf. A nil
// Capture is a process that sees the tracer's files.
func (c *Capture) Symbol() symbolize.Proc {
	if c == nil {
		return symbolize.Proc{}
	}
	if c.Node != "" {
		// Another host's (a merged trace's): never looked up in this
		// host's /proc, whatever runs there now under its PID.
		return symbolize.Proc{OwnRoot: c.OwnRoot}
	}
	return symbolize.Proc{PID: int(c.PID), Start: c.Start, OwnRoot: c.OwnRoot}
}

// Mappings returns c's mappings; nil for a nil Capture.
func (c *Capture) Mappings() []proc.Mapping {
	if c == nil {
		return nil
	}
	return c.Maps
}

// Covers reports whether every address of stack lies in one of c's
// mappings: when not, something was mapped since c was taken (a library
// dlopen'ed late). A nil Capture covers only an empty stack. The live
// reader asks this of every record, and a PyTorch process maps hundreds
// of files: each address is looked up by binary search in the mappings,
// which /proc lists in address order (a scan of them all confirms a miss,
// should a capture's mappings be in another order).
func (c *Capture) Covers(stack []uint64) bool {
	_, found := c.Uncovered(stack)
	return !found
}

// Uncovered returns the first address of stack that lies in none of c's
// mappings, and whether there is one.
func (c *Capture) Uncovered(stack []uint64) (uint64, bool) {
	maps := c.Mappings()
	for _, pc := range stack {
		if !covers(maps, pc) {
			return pc, true
		}
	}
	return 0, false
}

func covers(maps []proc.Mapping, pc uint64) bool {
	if proc.Find(maps, pc) >= 0 {
		return true
	}
	for i := range maps {
		if pc >= maps[i].Start && pc < maps[i].End {
			return true
		}
	}
	return false
}

// SameFiles reports whether all, a process's mappings as /proc lists them,
// holds the same executable files at the same places as c: a capture
// taken now would say what c says of them.
func (c *Capture) SameFiles(all []proc.Mapping) bool {
	i := 0
	for k := range all {
		m := &all[k]
		if !m.Exec() || !m.File() {
			continue
		}
		if i >= len(c.Maps) {
			return false
		}
		o := &c.Maps[i]
		if o.Start != m.Start || o.End != m.End || o.Offset != m.Offset || o.Inode != m.Inode || o.Dev != m.Dev || o.Path != m.Path {
			return false
		}
		i++
	}
	return i == len(c.Maps)
}

// UnwindFiles returns c's mappings with the paths of the files that hold
// their call-frame information, each opened later through proc.Open. A
// process that sees the tracer's files has them at their paths; a live
// one chrooted in the tracer's namespace (Root) has them inside its root
// (through /proc/PID/root, so that a symlink it made there resolves in
// it). One with its own root (a container) has its own: through
// /proc/PID/root while it lives; once it is gone, only host files with
// the build ID it mapped (another build's CFI would unwind wrong).
func (c *Capture) UnwindFiles() []proc.Mapping {
	if !c.OwnRoot {
		if c.Root == "" || !c.Symbol().Live() {
			return c.Maps
		}
		out := slices.Clone(c.Maps)
		for i, m := range out {
			if rel, ok := strings.CutPrefix(m.Path, strings.TrimSuffix(c.Root, "/")+"/"); ok {
				out[i].Path = proc.RootPath(int(c.PID), "/"+rel)
			}
		}
		return out
	}
	live := c.Symbol().Live()
	var out []proc.Mapping
	for _, m := range c.Maps {
		switch {
		case live:
			m.Path = proc.RootPath(int(c.PID), m.Path)
		case m.BuildID == "":
			continue
		default:
			if id, _ := symbolize.BuildID(m.Path); !strings.EqualFold(id, m.BuildID) {
				continue
			}
		}
		out = append(out, m)
	}
	return out
}

// RootDir is the directory c's paths are opened under: "" when it sees
// the tracer's files, /proc/PID/root when it has its own.
func (c *Capture) RootDir() string {
	if c == nil || !c.OwnRoot {
		return ""
	}
	return proc.RootPath(int(c.PID), "/")
}

// Read captures live process pid at boot time now: its executable file
// mappings with their build IDs (from ids), and who it is. comm names it
// should /proc not. prev is its capture before this one (nil the first
// time): its job and rank, read once, are kept. It also returns every
// mapping read (the interpreter's detection needs its data mappings too).
// A process gone before its mappings could be read gets a Capture with
// Error set and no Maps.
func Read(pid uint32, comm string, now uint64, ids *BuildIDs, prev *Capture) (*Capture, []proc.Mapping) {
	c := &Capture{PID: pid, Time: now, Comm: comm}
	all, err := proc.ReadMaps(int(pid))
	switch {
	case err != nil:
		c.Error = fmt.Sprintf("exited before its mappings could be read (%v): its stacks are not symbolized", err)
	case len(all) == 0:
		// An exiting process's /proc/PID/maps reads empty once its
		// address space is gone.
		c.Error = "exited before its mappings could be read (none left): its stacks are not symbolized"
	}
	// A container's paths name its own files: the host's file at the same
	// path is another build, with other CFI and symbols. /proc/PID/root
	// reads "/" after pivot_root: the mount namespace tells.
	c.OwnRoot, _ = proc.OwnRootOf(int(pid), all)
	for _, m := range all {
		if !m.Exec() || !m.File() {
			continue
		}
		m.BuildID = ids.Of(int(pid), m)
		c.Maps = append(c.Maps, m)
	}
	if n, err := proc.Comm(int(pid)); err == nil {
		c.Comm = n
	}
	c.Cmdline, _ = proc.Cmdline(int(pid))
	c.PPID, _ = proc.PPID(int(pid))
	if st, err := proc.StartTime(int(pid)); err == nil {
		c.Start = st
	} else if c.Error == "" && prev != nil && prev.PID == pid {
		// Reaped between the reads (its mappings read, its stat no
		// longer): it is prev's process, whose start says whether it
		// ran before the trace began (the report's "before tracing").
		c.Start = prev.Start
	}
	c.Exe, _ = os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if in, err := container.Of(int(pid)); err == nil {
		c.Container, c.Pod = in.ID, in.PodUID
	}
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err == nil && root != "/" {
		c.Root = root
	}
	c.identify(prev)
	return c, all
}

// Fill adds to c the mappings of from, an earlier capture of the same
// program in the same process (none of an exec before it), that none of
// c's overlaps. /proc/PID/maps read as the process exits can give part of
// its mappings, with no error (kernel 6.18: in 98 of 300 runs of a
// process that mapped 10 libraries, a read as it exited did; an empty
// one is Read's Error). A mapping from before that is gone now holds none
// of the stack's addresses, which lie in what is mapped; one replaced
// since overlaps c's and is left out.
func (c *Capture) Fill(from *Capture) {
	if from == nil || from.PID != c.PID || c.Error != "" || c.Start != 0 && from.Start != 0 && c.Start != from.Start {
		return
	}
	n := len(c.Maps)
	for _, m := range from.Maps {
		if !overlapsAny(c.Maps[:n], m) {
			c.Maps = append(c.Maps, m)
		}
	}
	c.Maps = sortedMaps(c.Maps)
}

// BuildIDs caches the build IDs of mapped files, by file: every process
// of a host maps the same few libraries. Only what was read is kept: a
// file that could not be opened (its process gone, its path replaced) is
// asked again the next time, maybe from another path.
type BuildIDs struct {
	m map[fileKey]string
}

type fileKey struct {
	path, dev string
	inode     uint64
}

// Of returns the build ID of the file m of process pid maps ("" when it
// has none or it could not be read): read as the process sees it, while
// it lives (proc.OpenMapping), else at its path here; either way only
// that very file (m's device and inode) is read.
func (b *BuildIDs) Of(pid int, m proc.Mapping) string {
	return b.of(m, func() (*os.File, error) {
		f, err := proc.OpenMapping(pid, m)
		if id, ok := m.ID(); err != nil && ok {
			f, err = proc.Open(m.Path, &id)
		}
		return f, err
	})
}

// OfFile returns the build ID of the file mapping m names, read at its
// path in the tracer's own tree, only if it is that file (m's device
// and inode) ("" when it has none or it could not be read).
func (b *BuildIDs) OfFile(m proc.Mapping) string {
	return b.of(m, func() (*os.File, error) {
		id, ok := m.ID()
		if !ok {
			return nil, fmt.Errorf("%s: no device and inode", m.Path)
		}
		return proc.Open(m.Path, &id)
	})
}

// of reads m's file, which open opens, once: the device too names it,
// since a container's file system numbers its inodes on its own. A file
// that could not be opened is not remembered.
func (b *BuildIDs) of(m proc.Mapping, open func() (*os.File, error)) string {
	k := fileKey{m.Path, m.Dev, m.Inode}
	if id, ok := b.m[k]; ok {
		return id
	}
	f, err := open()
	if err != nil {
		return ""
	}
	defer f.Close()
	// A file that is no ELF, or a malformed one, stays so: remembered.
	id, _ := symbolize.BuildIDFile(f)
	if b.m == nil {
		b.m = map[fileKey]string{}
	}
	b.m[k] = id
	return id
}

// overlaps reports whether mappings a and b share an address.
func overlaps(a, b proc.Mapping) bool { return a.Start < b.End && b.Start < a.End }

// overlapsAny reports whether any of maps shares an address with m.
func overlapsAny(maps []proc.Mapping, m proc.Mapping) bool {
	return slices.ContainsFunc(maps, func(o proc.Mapping) bool { return overlaps(o, m) })
}

// sortedMaps returns maps sorted by address (maps itself when it is).
func sortedMaps(maps []proc.Mapping) []proc.Mapping {
	byStart := func(a, b proc.Mapping) int { return cmp.Compare(a.Start, b.Start) }
	if slices.IsSortedFunc(maps, byStart) {
		return maps
	}
	return slices.SortedFunc(slices.Values(maps), byStart)
}
