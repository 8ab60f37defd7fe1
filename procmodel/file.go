package procmodel

import (
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The trace file's edge: its process, symbols and Python frames (package
// tracefile, whose JSON shapes docs/trace-format.md specifies) to and from
// the model's types. Only the recorder's writer, the replay's reader and
// the agent's trace window call these.

// FromFile returns the capture a process frame records.
func FromFile(p *tracefile.Process) *Capture {
	return &Capture{PID: p.PID, PPID: p.PPID, Comm: p.Comm, Cmdline: p.Cmdline, Exe: p.Exe, Time: p.Time,
		Start: p.Start, Root: p.Root, OwnRoot: p.OwnRoot, Container: p.Container, Pod: p.Pod, Error: p.Error,
		Job: jobFromFile(p.Job), JobError: p.JobError, Node: p.Node, NodePID: p.NodePID,
		Maps: convert(p.Maps, func(m tracefile.Mapping) proc.Mapping { return proc.Mapping(m) })}
}

// File returns the process frame that records c.
func (c *Capture) File() *tracefile.Process {
	return &tracefile.Process{PID: c.PID, PPID: c.PPID, Comm: c.Comm, Cmdline: c.Cmdline, Exe: c.Exe, Time: c.Time,
		Start: c.Start, Root: c.Root, OwnRoot: c.OwnRoot, Container: c.Container, Pod: c.Pod, Error: c.Error,
		Job: JobFile(c.Job), JobError: c.JobError, Node: c.Node, NodePID: c.NodePID,
		Maps: convert(c.Maps, func(m proc.Mapping) tracefile.Mapping { return tracefile.Mapping(m) })}
}

// JobFile returns the process frame's job that records id (nil: none).
func JobFile(id *jobid.Identity) *tracefile.Job {
	if id == nil {
		return nil
	}
	opt := func(n int) *int {
		if n < 0 {
			return nil
		}
		return &n
	}
	return &tracefile.Job{ID: id.Job, Name: id.Name, Launcher: id.Launcher, Role: id.Role, Rank: opt(id.Rank),
		LocalRank: opt(id.LocalRank), WorldSize: id.WorldSize, NodeRank: opt(id.NodeRank), Vars: id.Vars}
}

func jobFromFile(j *tracefile.Job) *jobid.Identity {
	if j == nil {
		return nil
	}
	val := func(p *int) int {
		if p == nil || *p < 0 {
			return -1
		}
		return *p
	}
	return &jobid.Identity{Job: j.ID, Name: j.Name, Launcher: j.Launcher, Role: j.Role, Rank: val(j.Rank),
		LocalRank: val(j.LocalRank), WorldSize: max(j.WorldSize, 0), NodeRank: val(j.NodeRank), Vars: j.Vars}
}

// SymbolsFromFile returns the names a symbols frame records.
func SymbolsFromFile(fs []tracefile.Symbol) []Symbol {
	return convert(fs, func(f tracefile.Symbol) Symbol {
		return Symbol{BuildID: f.BuildID, Offset: f.Offset,
			Frame: symbolize.Frame{Offset: f.VAddr, Function: f.Function, File: f.File, Line: f.Line}}
	})
}

// SymbolsFile returns the symbols frame that records syms.
func SymbolsFile(syms []Symbol) *tracefile.Symbols {
	return &tracefile.Symbols{Frames: convert(syms, func(s Symbol) tracefile.Symbol {
		return tracefile.Symbol{BuildID: s.BuildID, Offset: s.Offset, VAddr: s.Frame.Offset,
			Function: s.Frame.Function, File: s.Frame.File, Line: s.Frame.Line}
	})}
}

// PythonFromFile keeps a python frame's facts in its process's table of
// Python frames (package pystack): a new table at the process's first
// such frame, or where its PID was taken by another (the frame gives the
// interpreter loop again); each code the file's tracefile.PyCode
// converted.
func (m *Processes) PythonFromFile(p *tracefile.Python) {
	pt := m.Python(p.PID)
	if pt == nil || len(p.Eval) > 0 && p.Codes == nil {
		pt = pystack.NewTable(p.Eval)
		m.SetPython(p.PID, pt)
	}
	if len(p.Eval) > 0 {
		pt.Eval = p.Eval
	}
	for _, c := range p.Codes {
		pt.Put(pystack.Code(c))
	}
}

// PyCodesFile returns the codes of a python frame that records cs.
func PyCodesFile(cs []pystack.Code) []tracefile.PyCode {
	return convert(cs, func(c pystack.Code) tracefile.PyCode { return tracefile.PyCode(c) })
}

// convert converts each element of in with f. A nil slice stays nil and
// an empty one empty: the file tells them apart (null, []).
func convert[S, D any](in []S, f func(S) D) []D {
	if in == nil {
		return nil
	}
	out := make([]D, len(in))
	for i, x := range in {
		out[i] = f(x)
	}
	return out
}
