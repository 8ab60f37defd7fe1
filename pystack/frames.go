package pystack

import (
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Merged stacks: a CPython process's Python frames are put into its
// native stacks, as py-spy --native does, and named again: one table per
// process, shared by the replay of a trace (report, export) and the live
// views (agent, top), so that both show the same merged stacks.
//
// In a merged stack a Python frame stands as a synthetic address: the top
// bit set (never a user-space address), the rest its number in the
// process's table. A ledger (ledger.Ledger) then tells apart stacks that
// differ only in their Python frames as it does by their native ones, and
// the table turns the addresses back into file:line:function.

const (
	addrBit = uint64(1) << 63
	// NoPythonAddr ends the stack of a CPython process's thread that had
	// no Python frame (a framework's own threads, autograd's backward
	// threads): it is named NoPythonFunction.
	NoPythonAddr = addrBit
)

// NoPythonFunction is the function name of the frame that says a CPython
// process's thread ran no Python code when it allocated.
const NoPythonFunction = "[no Python frames on this thread]"

// UnresolvedFunction begins the function name of a Python frame whose
// code object could not be read (it was freed before cudatrace read it):
// "[unresolved Python frame: why]". Such a frame is never given a file or
// line: an unresolved frame is shown as one, never as a wrong one.
const UnresolvedFunction = "[unresolved Python frame"

// Module is the Module of Python frames.
const Module = "[python]"

// IsPython reports whether addr is a merged stack's Python frame (or
// NoPythonAddr) rather than a return address.
func IsPython(addr uint64) bool { return addr&addrBit != 0 }

// Code is what one (code object, instruction) of a process's records
// stands for. The trace file records it as tracefile.PyCode.
type Code struct {
	Code     uint64
	Units    int32
	File     string
	Function string // qualified name from 3.11
	Line     int
	Error    string // why it could not be read (the code object was freed)
	// Renew: Code is a new code object at the address of one freed
	// before (its capture says another identity: bpf/pycode.h), and this
	// is its first frame put: the frames put before at that address are
	// the old object's, and name none of the new one's.
	Renew bool
}

// key is a frame of one code object: its address, the instruction, and
// which of the code objects that had the address (Renew) it is.
type key struct {
	code  uint64
	units int32
	epoch uint32
}

// Table is one process's Python frames, numbered in the order they were
// first put in it: what its merged stacks' synthetic addresses stand for.
// It is not safe for concurrent use; Names copies some of it for another
// goroutine.
type Table struct {
	// Eval are the address ranges of the interpreter loop
	// (_PyEval_EvalFrameDefault and its parts) in the process.
	Eval   [][2]uint64
	Minor  int // CPython 3.Minor; 0 when not known
	ids    map[key]uint64
	frames []Code // frames[id-1]
	// epochs are the code addresses renewed (Code.Renew), each with how
	// many times: the epoch of their frames' keys. Empty but in a process
	// that freed code objects and made others in their place.
	epochs map[uint64]uint32
	// recent is a direct-mapped cache in front of ids: a process's
	// records carry the same frames record after record, and hashing
	// each frame's 16-byte key for the map, twice a frame (Has, Stack),
	// was most of what a Python record added to the reader's work. A
	// key's id never changes once given, so nothing here goes stale.
	recent [256]recentID
}

type recentID struct {
	k  key
	id uint64 // 0: empty
}

// key is the key of (code, units) for the code object now at code.
func (t *Table) key(code uint64, units int32) key {
	if len(t.epochs) == 0 {
		return key{code, units, 0}
	}
	return key{code, units, t.epochs[code]}
}

// id is k's id in t, through recent.
func (t *Table) id(k key) (uint64, bool) {
	r := &t.recent[(k.code>>4^uint64(uint32(k.units))*0x9e3779b1^uint64(k.epoch))&uint64(len(t.recent)-1)]
	if r.id != 0 && r.k == k {
		return r.id, true
	}
	id, ok := t.ids[k]
	if ok {
		*r = recentID{k, id}
	}
	return id, ok
}

// NewTable returns an empty table for a process whose interpreter loop
// spans eval.
func NewTable(eval [][2]uint64) *Table {
	return &Table{Eval: eval, ids: map[key]uint64{}}
}

// Has reports whether the frame of (code, units) is in t: resolved, well
// or not, so not to be read again.
func (t *Table) Has(code uint64, units int32) bool {
	_, ok := t.id(t.key(code, units))
	return ok
}

// Put adds c's frame, or replaces what t knew of it, and returns its
// synthetic address. With c.Renew the frames put before at c.Code are
// left to the code object that had the address then: the frames of
// c.Code from now on are the new one's.
func (t *Table) Put(c Code) uint64 {
	if c.Renew {
		if t.epochs == nil {
			t.epochs = map[uint64]uint32{}
		}
		t.epochs[c.Code]++
	}
	k := t.key(c.Code, c.Units)
	if id, ok := t.id(k); ok {
		t.frames[id-1] = c
		return addrBit | id
	}
	t.frames = append(t.frames, c)
	id := uint64(len(t.frames))
	t.ids[k] = id
	return addrBit | id
}

// Unresolved is the number of frames of t that could not be read (their
// Error says why).
func (t *Table) Unresolved() int {
	n := 0
	for _, c := range t.frames {
		if c.Error != "" {
			n++
		}
	}
	return n
}

// Len is the number of frames in t.
func (t *Table) Len() int { return len(t.frames) }

// Codes returns the frames from the i-th put on (0: all), in the order
// they were put: the trace's python records that describe them.
func (t *Table) Codes(i int) []Code {
	return append([]Code(nil), t.frames[min(i, len(t.frames)):]...)
}

// Stack appends to dst ev's native stack with its Python frames merged in
// (Merge), or with NoPythonAddr at its end for a thread that had none, and
// returns it. A frame never put in t is put now, unnamed. ok is false, and
// dst returned as is, when ev carries no Python frames to merge.
func (t *Table) Stack(dst []uint64, ev *events.Event) (merged []uint64, ok bool) {
	switch {
	case ev.Flags&events.FlagNoPython != 0:
		return append(append(dst, ev.Stack...), NoPythonAddr), true
	case ev.Flags&events.FlagPython == 0:
		return dst, false
	}
	return Merge(dst, ev.Stack, ev.Py, t.Eval, func(f events.PyFrame) uint64 {
		if id, ok := t.id(t.key(f.Code, f.Units)); ok {
			return addrBit | id
		}
		return t.Put(Code{Code: f.Code, Units: f.Units, Error: "not resolved while recording"})
	}), true
}

// Merge appends to dst native with each address inside eval replaced by
// the next run of py (innermost first; events.PyEntry ends a run), each
// Python frame as addr gives it, and returns it. Runs left over (the
// native stack was cut short) go at the outer end. This is where
// py-spy --native puts them: each frame of _PyEval_EvalFrameDefault,
// innermost first, gives way to the Python frames that call of it runs.
// Loop frames next to each other are one call of the loop: CPython 3.14's
// tail-calling interpreter (clang builds) runs each instruction in a
// handler function of its own (_TAIL_CALL_CALL, ...), which handlers enter
// by tail calls, so the instruction that made the C call stands as one
// handler frame right above the _PyEval_EvalFrameDefault frame that
// entered the loop: the run takes the place of both. (Without tail calls
// the loop never calls itself directly: a C function's frame always
// stands between two of its calls.)
func Merge(dst, native []uint64, py []events.PyFrame, eval [][2]uint64, addr func(events.PyFrame) uint64) []uint64 {
	i := 0
	run := func() {
		for i < len(py) {
			f := py[i]
			i++
			dst = append(dst, addr(f))
			if f.Flags&events.PyEntry != 0 {
				return
			}
		}
	}
	merged := false // the frame before was a loop frame given a run
	for _, pc := range native {
		loop := inRanges(pc, eval)
		switch {
		case loop && merged:
		case loop && i < len(py):
			run()
			merged = true
		default:
			dst = append(dst, pc)
			merged = false
		}
	}
	for i < len(py) {
		run()
	}
	return dst
}

func inRanges(pc uint64, rs [][2]uint64) bool {
	for _, r := range rs {
		if pc >= r[0] && pc < r[1] {
			return true
		}
	}
	return false
}

// Frame names the synthetic address addr: NoPythonAddr, or a frame of t
// (t may be nil: the frame is then unnamed, in Module).
func (t *Table) Frame(addr uint64) symbolize.Frame {
	f := symbolize.Frame{Addr: addr, Module: Module}
	if addr == NoPythonAddr {
		f.Function = NoPythonFunction
		return f
	}
	if t == nil {
		return f
	}
	if id := addr &^ addrBit; id >= 1 && id <= uint64(len(t.frames)) {
		c := t.frames[id-1]
		f.Function, f.File, f.Line = c.Function, c.File, c.Line
		if c.Error != "" {
			f.Function, f.File, f.Line = UnresolvedFunction+": "+c.Error+"]", "", 0
		}
	}
	return f
}

// Fill names the Python frames of f (symbolized from a merged stack) from
// t; t may be nil.
func (t *Table) Fill(f []symbolize.Frame) {
	for i := range f {
		if IsPython(f[i].Addr) {
			f[i] = t.Frame(f[i].Addr)
		}
	}
}

// Names is a copy of the names of some of a table's synthetic addresses,
// for a goroutine other than the table's.
type Names map[uint64]symbolize.Frame

// Names adds to n the names of the Python frames among addrs and returns
// it (a new Names when n is nil and there are any). t may be nil.
func (t *Table) Names(n Names, addrs []uint64) Names {
	for _, a := range addrs {
		if !IsPython(a) {
			continue
		}
		if _, ok := n[a]; ok {
			continue
		}
		if n == nil {
			n = Names{}
		}
		n[a] = t.Frame(a)
	}
	return n
}

// Fill names the Python frames of f from n; one n lacks is unnamed.
func (n Names) Fill(f []symbolize.Frame) {
	for i := range f {
		if !IsPython(f[i].Addr) {
			continue
		}
		if nf, ok := n[f[i].Addr]; ok {
			f[i] = nf
		} else {
			f[i] = (*Table)(nil).Frame(f[i].Addr)
		}
	}
}
