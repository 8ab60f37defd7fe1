package pystack

import (
	"errors"

	"github.com/cudatrace/cudatrace/events"
)

// Captures are one process's code objects as BPF captured them
// (bpf/pycode.h), by address, the latest at each: what its frames are
// named from first (Name). The zero value is ready; it is not safe for
// concurrent use.
type Captures struct {
	codes map[uint64]capturedCode
	// renew are the addresses whose latest capture is of another code
	// object than the frames named there.
	renew map[uint64]bool
}

// capturedCode is what a capture named of a code object: its identity
// then, and the names (info) or why it could not be named from the
// capture (err: the process is read instead).
type capturedCode struct {
	ident uint64
	info  *CodeInfo
	err   error
}

// Put takes a code object's capture by in's BPF, made before the record
// that showed it. A capture at an address whose last capture had another
// identity is a new code object where a freed one was: the next frame
// named there is a Renew one (Code.Renew), which renews the process's
// table.
func (cs *Captures) Put(in *Interp, c *events.PyCodeCapture) {
	cc := capturedCode{ident: c.Ident}
	cc.info, cc.err = in.Parse(c)
	if cs.codes == nil {
		cs.codes = map[uint64]capturedCode{}
	}
	if old, ok := cs.codes[c.Code]; ok && old.ident != c.Ident {
		if cs.renew == nil {
			cs.renew = map[uint64]bool{}
		}
		cs.renew[c.Code] = true
	}
	cs.codes[c.Code] = cc
}

// Renewed says whether the code object at code is another than the one
// whose frames were named there last: its frames must be named again,
// whatever the process's table holds.
func (cs *Captures) Renewed(code uint64) bool { return cs.renew[code] }

// Name names frame f of process pid, whose interpreter is in, for its
// table: from its code object's capture, else from the process's memory
// (while the code object lives; read says it was read). A frame neither
// names has Error set. The first frame named at a renewed address is the
// Renew one.
func (cs *Captures) Name(in *Interp, pid int, f events.PyFrame) (c Code, read bool) {
	c = Code{Code: f.Code, Units: f.Units, Renew: cs.renew[f.Code]}
	if c.Renew {
		delete(cs.renew, f.Code)
	}
	fr, read, err := cs.frame(in, pid, f)
	if err != nil {
		c.Error = err.Error()
	}
	c.File, c.Function, c.Line = fr.File, fr.Function, fr.Line
	return c, read
}

func (cs *Captures) frame(in *Interp, pid int, f events.PyFrame) (Frame, bool, error) {
	cc, ok := cs.codes[f.Code]
	if ok && cc.info != nil {
		fr, err := cc.info.Frame(int64(f.Units))
		if !errors.Is(err, ErrNotCaptured) {
			return fr, false, err
		}
	}
	fr, err := in.Code(pid, f.Code, int64(f.Units))
	if err != nil && ok && cc.err != nil && !errors.Is(cc.err, ErrNotCaptured) {
		// What the capture showed says more than a read after the fact.
		return fr, true, cc.err
	}
	return fr, true, err
}
