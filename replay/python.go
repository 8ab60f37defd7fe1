package replay

import (
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// python keeps a CPython process's frame facts (tracefile.Python records)
// in its table (package pystack), in the process model: each code a
// pystack.Code, the file's tracefile.PyCode converted.
func (t *Trace) python(p *tracefile.Python) {
	pt := t.Procs.Python(p.PID)
	if pt == nil || len(p.Eval) > 0 && p.Codes == nil {
		pt = pystack.NewTable(p.Eval) // a process's first record, or its PID taken by another
		t.Procs.SetPython(p.PID, pt)
	}
	if len(p.Eval) > 0 {
		pt.Eval = p.Eval
	}
	for _, c := range p.Codes {
		pt.Put(pystack.Code(c))
	}
}
