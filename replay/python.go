package replay

import (
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Python frames stand in a stack as synthetic addresses: the top bit set
// (never a user-space address), the rest an index into the process's
// table of Python frames. The ledger then tells stacks apart by their
// Python frames as by their native ones, and Symbols turns them back into
// file:line:function.
const (
	pyAddrBit = uint64(1) << 63
	// NoPythonAddr ends the stack of a CPython process's thread that had
	// no Python frame (a framework's own threads, autograd's backward
	// threads): Symbols names it NoPythonFunction.
	NoPythonAddr = pyAddrBit
)

// NoPythonFunction is the function name of the frame that says a CPython
// process's thread ran no Python code when it allocated.
const NoPythonFunction = "[no Python frames on this thread]"

// PythonModule is the Module of Python frames.
const PythonModule = "[python]"

type pyKey struct {
	code  uint64
	units int32
}

// pyProc is one process's Python frame facts (tracefile.Python records).
type pyProc struct {
	eval   [][2]uint64
	ids    map[pyKey]uint64
	frames []tracefile.PyCode // frames[id-1]
}

func (t *Trace) python(p *tracefile.Python) {
	if t.py == nil {
		t.py = map[uint32]*pyProc{}
	}
	pp := t.py[p.PID]
	if pp == nil || len(p.Eval) > 0 && p.Codes == nil {
		pp = &pyProc{ids: map[pyKey]uint64{}} // a process's first record, or its PID taken by another
		t.py[p.PID] = pp
	}
	if len(p.Eval) > 0 {
		pp.eval = p.Eval
	}
	for _, c := range p.Codes {
		k := pyKey{c.Code, c.Units}
		if id, ok := pp.ids[k]; ok {
			pp.frames[id-1] = c
			continue
		}
		pp.frames = append(pp.frames, c)
		pp.ids[k] = uint64(len(pp.frames))
	}
}

// mergePython puts ev's Python frames into its native stack where the
// interpreter loop stands, as py-spy --native does: each frame of
// _PyEval_EvalFrameDefault, innermost first, gives way to the run of
// Python frames that call of it executes. Runs left over (the native
// stack was cut short) go at the outer end. A thread without Python frames
// ends with NoPythonAddr.
func (t *Trace) mergePython(ev *events.Event) {
	if ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		return
	}
	pp := t.py[ev.PID]
	if pp == nil {
		return
	}
	if ev.Flags&events.FlagNoPython != 0 {
		ev.Stack = append(ev.Stack, NoPythonAddr)
		return
	}
	ev.Stack = MergePython(ev.Stack, ev.Py, pp.eval, func(f events.PyFrame) uint64 {
		id, ok := pp.ids[pyKey{f.Code, f.Units}]
		if !ok { // never resolved: an unknown frame all the same
			pp.frames = append(pp.frames, tracefile.PyCode{Code: f.Code, Units: f.Units, Error: "not resolved while recording"})
			id = uint64(len(pp.frames))
			pp.ids[pyKey{f.Code, f.Units}] = id
		}
		return pyAddrBit | id
	})
}

// MergePython returns native with each address inside eval replaced by the
// next run of py (innermost first; events.PyEntry ends a run), each Python
// frame as addr gives it.
func MergePython(native []uint64, py []events.PyFrame, eval [][2]uint64, addr func(events.PyFrame) uint64) []uint64 {
	out := make([]uint64, 0, len(native)+len(py))
	i := 0
	run := func() {
		for i < len(py) {
			f := py[i]
			i++
			out = append(out, addr(f))
			if f.Flags&events.PyEntry != 0 {
				return
			}
		}
	}
	for _, pc := range native {
		if i < len(py) && inRanges(pc, eval) {
			run()
			continue
		}
		out = append(out, pc)
	}
	for i < len(py) {
		run()
	}
	return out
}

func inRanges(pc uint64, rs [][2]uint64) bool {
	for _, r := range rs {
		if pc >= r[0] && pc < r[1] {
			return true
		}
	}
	return false
}

// pythonFrames turns the synthetic addresses of f into Python frames.
func (t *Trace) pythonFrames(pid uint32, f []symbolize.Frame) {
	for i := range f {
		a := f[i].Addr
		if a&pyAddrBit == 0 {
			continue
		}
		f[i] = symbolize.Frame{Addr: a, Module: PythonModule}
		if a == NoPythonAddr {
			f[i].Function = NoPythonFunction
			continue
		}
		id := a &^ pyAddrBit
		if pp := t.py[pid]; pp != nil && id >= 1 && id <= uint64(len(pp.frames)) {
			c := pp.frames[id-1]
			f[i].Function, f[i].File, f[i].Line = c.Function, c.File, c.Line
			if c.Error != "" && c.Function == "" {
				f[i].Function = "[python: " + c.Error + "]"
			}
		}
	}
}
