package procmodel

import (
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Process is what is known of one traced process.
type Process struct {
	PID    uint32
	First  *Capture // the first capture (the command line at its start)
	Latest *Capture // the latest, complete or not
	// current is the latest capture that did not fail (or the first,
	// when all did): what a stack first seen now is read against. A
	// capture that failed (the process exited first) says nothing of
	// its mappings, so it does not replace the ones read before.
	current *Capture
	// Py names the Python frames of the process's stacks (a CPython
	// process's, package pystack); nil when it runs none.
	Py     *pystack.Table
	stacks []*ledger.Stack // bound to a capture, to forget with it
}

// Current is the capture the process's stacks seen now are read against.
func (p *Process) Current() *Capture {
	if p == nil {
		return nil
	}
	return p.current
}

// Processes owns every traced process's Process, by PID, and binds each
// stack to the capture current when it was first seen: the mappings its
// addresses mean. A later capture (after a dlopen or an exec) describes
// the addresses of later stacks, not of those seen before. It is not safe
// for concurrent use: View copies what naming some stacks needs for
// another goroutine.
type Processes struct {
	procs  map[uint32]*Process
	stacks map[*ledger.Stack]*Capture
	// Stacks first seen before any capture of their process: they take
	// the first capture that comes.
	pending map[uint32][]*ledger.Stack
}

// New returns an empty model.
func New() *Processes {
	return &Processes{procs: map[uint32]*Process{}, stacks: map[*ledger.Stack]*Capture{},
		pending: map[uint32][]*ledger.Stack{}}
}

// Get returns pid's Process; nil when none is known.
func (m *Processes) Get(pid uint32) *Process { return m.procs[pid] }

func (m *Processes) get(pid uint32) *Process {
	if p, ok := m.procs[pid]; ok {
		return p
	}
	p := &Process{PID: pid}
	m.procs[pid] = p
	return p
}

// Add records capture c of its process and returns the Process. A PID
// taken by another process is the caller's to tell (Forget it first):
// the recorder and the agent know, a trace replayed keeps one account
// per PID, as its ledger does.
func (m *Processes) Add(c *Capture) *Process {
	p := m.get(c.PID)
	if p.First == nil {
		p.First = c
	}
	p.Latest = c
	if p.current == nil || c.Error == "" {
		p.current = c
	}
	for _, st := range m.pending[c.PID] {
		m.stacks[st] = p.current
	}
	delete(m.pending, c.PID)
	return p
}

// SetPython gives pid the table that names its Python frames (a new one
// when another process took the PID).
func (m *Processes) SetPython(pid uint32, t *pystack.Table) { m.get(pid).Py = t }

// Python returns the table naming pid's Python frames; nil when none.
func (m *Processes) Python(pid uint32) *pystack.Table {
	if p := m.procs[pid]; p != nil {
		return p.Py
	}
	return nil
}

// Bind reads st, a stack of pid seen now, against pid's current capture,
// unless it was bound before.
func (m *Processes) Bind(pid uint32, st *ledger.Stack) {
	if _, seen := m.stacks[st]; seen {
		return
	}
	p := m.get(pid)
	p.stacks = append(p.stacks, st)
	m.stacks[st] = p.current
	if p.current == nil {
		m.pending[pid] = append(m.pending[pid], st)
	}
}

// CaptureOf returns the capture st is read against; nil when its process
// was never captured.
func (m *Processes) CaptureOf(st *ledger.Stack) *Capture { return m.stacks[st] }

// Stacks returns how many stacks are bound to a capture.
func (m *Processes) Stacks() int { return len(m.stacks) }

// Forget drops everything known of pid.
func (m *Processes) Forget(pid uint32) {
	p := m.procs[pid]
	if p == nil {
		return
	}
	for _, st := range p.stacks {
		delete(m.stacks, st)
	}
	delete(m.pending, pid)
	delete(m.procs, pid)
}

// Frames names st (nil: no frames), on the model's goroutine: the one way
// a stack becomes frames (Frames).
func (m *Processes) Frames(sym *symbolize.Symbolizer, st *ledger.Stack) []symbolize.Frame {
	if st == nil {
		return []symbolize.Frame{}
	}
	return Frames(sym, m.stacks[st], m.Python(st.PID), st.Frames)
}

// PythonNames is what names a merged stack's Python frames: a process's
// *pystack.Table on its goroutine, or a copy of some of its names
// (pystack.Names) on another. Both may be nil.
type PythonNames interface {
	Fill(f []symbolize.Frame)
}

// Frames names addrs, a stack (innermost first, Python frames merged in as
// package pystack does) of the process captured in c: its native frames
// from c's mappings and the files they name (a container's own while it
// lives, symbolize.FramesOf), its Python frames from py. sym nil leaves
// native frames as addresses.
func Frames(sym *symbolize.Symbolizer, c *Capture, py PythonNames, addrs []uint64) []symbolize.Frame {
	f := sym.FramesOf(c.Symbol(), c.Mappings(), addrs)
	if py != nil {
		py.Fill(f)
	} else {
		(*pystack.Table)(nil).Fill(f)
	}
	return f
}

// View is a copy of what naming some stacks needs, taken on the model's
// goroutine, to name them on another: the captures they are read against
// (never changed once made) and their Python frames' names.
type View struct {
	caps map[*ledger.Stack]*Capture
	py   map[uint32]pystack.Names
}

// NewView returns an empty View.
func NewView() *View {
	return &View{caps: map[*ledger.Stack]*Capture{}, py: map[uint32]pystack.Names{}}
}

// Add copies what naming st needs from m (on m's goroutine). st nil is
// left out.
func (v *View) Add(m *Processes, st *ledger.Stack) {
	if st == nil {
		return
	}
	if _, ok := v.caps[st]; ok {
		return
	}
	v.caps[st] = m.stacks[st]
	if n := m.Python(st.PID).Names(v.py[st.PID], st.Frames); n != nil {
		v.py[st.PID] = n
	}
}

// CaptureOf returns the capture st is read against (nil: none).
func (v *View) CaptureOf(st *ledger.Stack) *Capture { return v.caps[st] }

// Frames names st (nil: no frames), on any goroutine.
func (v *View) Frames(sym *symbolize.Symbolizer, st *ledger.Stack) []symbolize.Frame {
	if st == nil {
		return []symbolize.Frame{}
	}
	return Frames(sym, v.caps[st], v.py[st.PID], st.Frames)
}
