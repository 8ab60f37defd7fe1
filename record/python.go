package record

import (
	"fmt"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pyframes"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// pyProc is a CPython process's interpreter, as the session knows it.
type pyProc struct {
	in *pystack.Interp
	// table holds the (code, instruction) pairs resolved so far, read
	// once each: the stacks the ledger keeps have them merged in. nil
	// until the process's first event with Python frames.
	table *pyframes.Table
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
	in, err := pystack.Detect(maps)
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
	ps.py = &pyProc{in: in}
	if s.w != nil {
		if err := s.w.WritePython(&tracefile.Python{PID: pid, Minor: in.Minor, Eval: in.Eval}); err != nil {
			s.warn(err)
		}
	}
}

// resolvePython reads what the code objects of ev's Python frames are
// (file, function, line), for those not read before, into the process's
// table, and writes them to the trace: code objects live in the process
// and may be freed once it moves on, so they are read now, before the
// event itself is written, with or without a trace file (the live views
// name them from the table).
func (s *session) resolvePython(ev *events.Event, ps *procState) {
	if ps.py == nil || ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		return
	}
	if ps.py.table == nil {
		ps.py.table = pyframes.NewTable(ps.py.in.Eval)
		ps.py.table.Minor = ps.py.in.Minor
		if s.opts.Observer != nil {
			s.opts.Observer.Python(ev.PID, ps.py.table)
		}
	}
	var out []tracefile.PyCode
	var m *pystack.Mem
	for _, f := range ev.Py {
		if ps.py.table.Has(f.Code, f.Units) {
			continue
		}
		c := tracefile.PyCode{Code: f.Code, Units: f.Units}
		if m == nil {
			var err error
			if m, err = pystack.OpenMem(int(ev.PID)); err != nil {
				c.Error = err.Error()
				ps.py.table.Put(c)
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
		ps.py.table.Put(c)
		out = append(out, c)
	}
	if len(out) == 0 || s.w == nil {
		return
	}
	if err := s.w.WritePython(&tracefile.Python{PID: ev.PID, Codes: out}); err != nil {
		s.warn(err)
	}
}

// apply hands ev to the ledger with its Python frames merged into its
// stack, as replay does, so that the live views' stacks are those report
// shows and stacks that differ only in their Python frames stay apart.
// ev keeps its native stack: the observers and the trace get the record
// as captured.
func (s *session) apply(ev *events.Event, ps *procState) events.Change {
	if ps.py == nil || ps.py.table == nil {
		return s.res.Ledger.Apply(ev)
	}
	merged, ok := ps.py.table.Stack(s.merged[:0], ev)
	if !ok {
		return s.res.Ledger.Apply(ev)
	}
	s.merged = merged
	native := ev.Stack
	ev.Stack = merged // the ledger copies the frames of a stack it keeps
	ch := s.res.Ledger.Apply(ev)
	ev.Stack = native
	return ch
}
