package procmodel

import (
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The trace file's edge: its process and symbols frames (package
// tracefile, whose JSON shapes docs/trace-format.md specifies) to and from
// the model's types. Only the recorder's writer and the replay's reader
// call these.

// FromFile returns the capture a process frame records.
func FromFile(p *tracefile.Process) *Capture {
	c := &Capture{PID: p.PID, PPID: p.PPID, Comm: p.Comm, Cmdline: p.Cmdline, Exe: p.Exe, Time: p.Time,
		Start: p.Start, Root: p.Root, OwnRoot: p.OwnRoot, Container: p.Container, Pod: p.Pod, Error: p.Error}
	if p.Maps != nil {
		c.Maps = make([]proc.Mapping, len(p.Maps))
		for i, m := range p.Maps {
			c.Maps[i] = proc.Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Perms: m.Perms, Dev: m.Dev,
				Inode: m.Inode, Path: m.Path, BuildID: m.BuildID}
		}
	}
	return c
}

// File returns the process frame that records c.
func (c *Capture) File() *tracefile.Process {
	p := &tracefile.Process{PID: c.PID, PPID: c.PPID, Comm: c.Comm, Cmdline: c.Cmdline, Exe: c.Exe, Time: c.Time,
		Start: c.Start, Root: c.Root, OwnRoot: c.OwnRoot, Container: c.Container, Pod: c.Pod, Error: c.Error}
	if c.Maps != nil {
		p.Maps = make([]tracefile.Mapping, len(c.Maps))
		for i, m := range c.Maps {
			p.Maps[i] = tracefile.Mapping{Start: m.Start, End: m.End, Offset: m.Offset, Perms: m.Perms, Dev: m.Dev,
				Inode: m.Inode, Path: m.Path, BuildID: m.BuildID}
		}
	}
	return p
}

// SymbolsFromFile returns the names a symbols frame records.
func SymbolsFromFile(fs []tracefile.Symbol) []Symbol {
	out := make([]Symbol, len(fs))
	for i, f := range fs {
		out[i] = Symbol{BuildID: f.BuildID, Offset: f.Offset,
			Frame: symbolize.Frame{Offset: f.VAddr, Function: f.Function, File: f.File, Line: f.Line}}
	}
	return out
}

// SymbolsFile returns the symbols frame that records syms.
func SymbolsFile(syms []Symbol) *tracefile.Symbols {
	out := &tracefile.Symbols{Frames: make([]tracefile.Symbol, len(syms))}
	for i, s := range syms {
		out.Frames[i] = tracefile.Symbol{BuildID: s.BuildID, Offset: s.Offset, VAddr: s.Frame.Offset,
			Function: s.Frame.Function, File: s.Frame.File, Line: s.Frame.Line}
	}
	return out
}
