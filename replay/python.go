package replay

import (
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/pyframes"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// python keeps a CPython process's frame facts (tracefile.Python records)
// in its table (package pyframes).
func (t *Trace) python(p *tracefile.Python) {
	if t.py == nil {
		t.py = map[uint32]*pyframes.Table{}
	}
	pt := t.py[p.PID]
	if pt == nil || len(p.Eval) > 0 && p.Codes == nil {
		pt = pyframes.NewTable(p.Eval) // a process's first record, or its PID taken by another
		t.py[p.PID] = pt
	}
	if len(p.Eval) > 0 {
		pt.Eval = p.Eval
	}
	for _, c := range p.Codes {
		pt.Put(c)
	}
}

// mergePython puts ev's Python frames into its native stack where the
// interpreter loop stands (pyframes.Table.Stack). A thread without Python
// frames ends with pyframes.NoPythonAddr.
func (t *Trace) mergePython(ev *events.Event) {
	if ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		return
	}
	pt := t.py[ev.PID]
	if pt == nil {
		return
	}
	if st, ok := pt.Stack(nil, ev); ok {
		ev.Stack = st
	}
}

// pythonFrames names the Python frames of f.
func (t *Trace) pythonFrames(pid uint32, f []symbolize.Frame) {
	t.py[pid].Fill(f)
}
