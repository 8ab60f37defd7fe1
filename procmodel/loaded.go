package procmodel

import (
	"cmp"
	"debug/elf"
	"fmt"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// WithLoaded is base (nil: nothing known of the process yet) with the
// objects a process's dynamic loader reported mapping (bpf/notify.h) as
// mappings: for a process gone before its mappings could be read, what
// its loader's list said names its stacks. Each object's executable
// segments are laid out from its file's program headers, moved by its
// load bias, as the loader mapped them. exe is the program's own file
// (the list's entry without a path). Objects whose file cannot be read
// here are left out: a container's, once the container is gone (another
// build of the same path on the host would name its frames wrong), and
// what is no file (the vDSO).
func WithLoaded(base *Capture, pid uint32, at uint64, exe string, objs []events.LoadedObject, ids *BuildIDs) *Capture {
	c := &Capture{PID: pid, Time: at, Exe: exe}
	if base != nil {
		cp := *base
		c = &cp
		c.Time, c.Maps = at, slices.Clone(base.Maps)
		if c.Exe == "" {
			c.Exe = exe
		}
	}
	if c.OwnRoot {
		return c
	}
	for _, o := range objs {
		for _, m := range loadedMappings(objectPath(o, c.Exe), o.Bias) {
			m.BuildID = ids.OfFile(m)
			c.Maps = slices.DeleteFunc(c.Maps, func(o proc.Mapping) bool { return overlaps(o, m) })
			c.Maps = append(c.Maps, m)
		}
	}
	c.Maps = sortedMaps(c.Maps)
	c.Error = ""
	return c
}

// FillLoaded adds to c, read from a live process, the executable segments
// of the objects its loader reported mapping (objs; exe, the program's
// own file when c has none) where c has none of that file's and none of
// its mappings overlaps them. Read as the process exits, /proc/PID/maps
// can hold some of a library's mappings and not its code's (a read of
// exiting python3's took its libraries' r--p without their r-xp in 1 of
// 200 runs here): the frames in that code would go unnamed, and their
// owner with them. Only files missing from c are opened, so a full read
// costs nothing more.
func (c *Capture) FillLoaded(objs []events.LoadedObject, exe string, ids *BuildIDs) {
	if c.Error != "" || c.OwnRoot || len(objs) == 0 {
		return
	}
	read := len(c.Maps)
	have := map[string]bool{}
	for _, m := range c.Maps {
		have[m.Path] = true
	}
	for _, o := range objs {
		path := objectPath(o, cmp.Or(c.Exe, exe))
		if path == "" || have[path] {
			continue
		}
		for _, m := range loadedMappings(path, o.Bias) {
			if !overlapsAny(c.Maps[:read], m) {
				m.BuildID = ids.OfFile(m)
				c.Maps = append(c.Maps, m)
			}
		}
	}
	c.Maps = sortedMaps(c.Maps)
}

// objectPath is the file of a loader's object: the program's own (exe)
// for the list's entry without a path; "" (nothing to open) when that is
// not an absolute path.
func objectPath(o events.LoadedObject, exe string) string {
	path := o.Path
	if path == "" {
		path = exe
	}
	if !filepath.IsAbs(path) {
		return ""
	}
	return path
}

// loadedMappings are the executable mappings of the ELF file at path,
// loaded with bias: one per PT_LOAD segment with PF_X, page-aligned as
// the loader maps them.
// The path is what the process's memory says: it is opened through
// proc.Open, which never blocks and opens only a regular file.
func loadedMappings(path string, bias uint64) []proc.Mapping {
	f, err := proc.OpenELF(path, nil)
	if err != nil {
		return nil
	}
	defer f.Close()
	var st unix.Stat_t
	if unix.Fstat(int(f.OS().Fd()), &st) != nil {
		return nil
	}
	const page = 4096
	var out []proc.Mapping
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || p.Memsz == 0 {
			continue
		}
		start := bias + p.Vaddr&^(page-1)
		end := bias + (p.Vaddr+p.Memsz+page-1)&^(page-1)
		out = append(out, proc.Mapping{Start: start, End: end, Offset: p.Off &^ (page - 1), Perms: "r-xp",
			Dev: fmt.Sprintf("%02x:%02x", unix.Major(st.Dev), unix.Minor(st.Dev)), Inode: st.Ino, Path: path})
	}
	return out
}
