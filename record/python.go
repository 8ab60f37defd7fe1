package record

import (
	"fmt"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// pyProc is a CPython process's interpreter, as the session knows it.
type pyProc struct {
	in   *pystack.Interp
	seen map[pyKey]bool // (code, instruction) pairs already written to the trace
}

type pyKey struct {
	code  uint64
	units int32
}

// detectPython looks for CPython 3.10 to 3.13 in a process's mappings
// when it is first seen and, where it runs one, tells BPF how to walk its
// threads' frames: its allocation records carry them from then on. A
// launched command is held (SIGSTOP) at its first record, which therefore
// has none; the records after it do.
func (s *session) detectPython(pid uint32, ps *procState, maps []proc.Mapping) {
	if ps.py != nil || ps.pyTried || s.opts.NoPythonFrames {
		return
	}
	ps.pyTried = true
	in, err := pystack.Detect(ps.root, maps)
	if err != nil {
		s.warn(fmt.Errorf("pid %d: Python frames left out: %w", pid, err))
		return
	}
	if in == nil {
		return
	}
	l := in.Layout()
	o := bpf.CudatraceCtPyoffsets{InterpHead: l.InterpHead, InterpThreads: l.InterpThreads, TsNext: l.TsNext,
		TsNativeId: l.TsNativeID, TsThreadId: l.TsThreadID, TsFrame: l.TsFrame, TsCframe: l.TsCFrame,
		CfCurrent: l.CFCurrent, FrPrevious: l.FrPrevious, FrCode: l.FrCode, FrInstr: l.FrInstr,
		FrOwner: l.FrOwner, FrEntry: l.FrEntry, CoCodeAdaptive: l.CodeAt, Minor: l.Minor}
	if s.tr != nil {
		if err := s.tr.SetPython(pid, &o); err != nil {
			s.warn(err)
			return
		}
	}
	ps.py = &pyProc{in: in, seen: map[pyKey]bool{}}
	if s.w != nil {
		if err := s.w.WritePython(&tracefile.Python{PID: pid, Minor: in.Minor, Eval: in.Eval}); err != nil {
			s.warn(err)
		}
	}
}

// resolvePython writes to the trace what the code objects of ev's Python
// frames are (file, function, line), for those not written before: code
// objects live in the process and may be freed once it moves on, so they
// are read now, before the event itself is written.
func (s *session) resolvePython(ev *events.Event, ps *procState) {
	if ps.py == nil || s.w == nil || len(ev.Py) == 0 {
		return
	}
	var out []tracefile.PyCode
	var m *pystack.Mem
	for _, f := range ev.Py {
		k := pyKey{f.Code, f.Units}
		if ps.py.seen[k] {
			continue
		}
		ps.py.seen[k] = true
		c := tracefile.PyCode{Code: f.Code, Units: f.Units}
		if m == nil {
			var err error
			if m, err = pystack.OpenMem(int(ev.PID)); err != nil {
				c.Error = err.Error()
				out = append(out, c)
				continue
			}
			defer m.Close()
		}
		fr, err := ps.py.in.Code(m, f.Code, int64(f.Units))
		if err != nil {
			c.Error = err.Error()
		}
		c.File, c.Function, c.Line = fr.File, fr.Function, fr.Line
		out = append(out, c)
	}
	if len(out) == 0 {
		return
	}
	if err := s.w.WritePython(&tracefile.Python{PID: ev.PID, Codes: out}); err != nil {
		s.warn(err)
	}
}
