package record

import (
	"fmt"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pyframes"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// detectPython looks for CPython 3.10 to 3.14 in a process's mappings
// when it is first seen and, where it runs one, tells BPF how to walk its
// threads' frames: its allocation records carry them from then on. The
// first record, made before, has none from BPF; a launched command is
// held (SIGSTOP) there, so that record gets its thread's frames read from
// user space instead (heldPython). A --pid process was looked at when
// tracing started (detectPythonAtStart): BPF walks its first record too.
func (s *session) detectPython(pid uint32, lp *liveProc, root string, maps []proc.Mapping) {
	if lp.py != nil || lp.pyTried || s.opts.NoPythonFrames {
		return
	}
	lp.pyTried = true
	in, set := s.pyAtStart[pid]
	delete(s.pyAtStart, pid)
	if !set {
		var err error
		if in, err = s.setPython(pid, root, maps); err != nil {
			s.warn(err)
			return
		}
	}
	if in == nil {
		return
	}
	lp.py = in
	if s.ev.PID == pid {
		s.heldPython(&s.ev, in)
	}
	if s.w != nil {
		if err := s.w.WritePython(&tracefile.Python{PID: pid, Minor: in.Minor, Eval: in.Eval}); err != nil {
			s.warn(err)
		}
	}
}

// setPython finds the interpreter in a process's mappings and tells BPF
// how to walk its threads' frames; nil and no error where it runs none.
func (s *session) setPython(pid uint32, root string, maps []proc.Mapping) (*pystack.Interp, error) {
	in, err := pystack.Detect(root, maps)
	if err != nil {
		return nil, fmt.Errorf("pid %d: Python frames left out: %w", pid, err)
	}
	if in == nil {
		return nil, nil
	}
	l := in.Layout()
	o := bpf.CudatraceCtPyoffsets{InterpHead: l.InterpHead, InterpThreads: l.InterpThreads, TsNext: l.TsNext,
		TsNativeId: l.TsNativeID, TsThreadId: l.TsThreadID, TsFrame: l.TsFrame, TsCframe: l.TsCFrame,
		CfCurrent: l.CFCurrent, FrPrevious: l.FrPrevious, FrCode: l.FrCode, FrInstr: l.FrInstr,
		FrOwner: l.FrOwner, FrEntry: l.FrEntry, CoCodeAdaptive: l.CodeAt, Minor: l.Minor}
	if s.tr != nil {
		if err := s.tr.SetPython(pid, &o); err != nil {
			return nil, err
		}
	}
	return in, nil
}

// detectPythonAtStart looks for CPython in the --pid processes before any
// of their records arrives, so that BPF walks their first allocation's
// Python frames too. What it finds waits in pyAtStart for the process's
// first record, which writes it to the trace (detectPython).
func (s *session) detectPythonAtStart(pids []int) {
	if s.opts.NoPythonFrames {
		return
	}
	for _, pid := range pids {
		maps, err := proc.ReadMaps(pid)
		if err != nil {
			continue // gone: its first record, if any, says so
		}
		root := "" // a container's paths name its own files
		if own, _ := proc.OwnRoot(pid); own {
			root = proc.RootPath(pid, "/")
		}
		in, err := s.setPython(uint32(pid), root, maps)
		if err != nil {
			s.warn(err)
		}
		if s.pyAtStart == nil {
			s.pyAtStart = map[uint32]*pystack.Interp{}
		}
		s.pyAtStart[uint32(pid)] = in // nil too: tried
	}
}

// heldPython gives a held record (a launched process's first, made before
// BPF knew the process runs CPython) the Python frames the walk in BPF
// would have: the process is stopped right after the call returned, so the
// thread's frames are still those of the call. Only records BPF walks get
// them: allocations' (not frees', which are recorded at entry without a
// stack, nor cuMemMap's).
func (s *session) heldPython(ev *events.Event, in *pystack.Interp) {
	if ev.Flags&events.FlagHeld == 0 || ev.Flags&(events.FlagPython|events.FlagNoPython|events.FlagAux) != 0 ||
		ev.Flags&events.FlagEntryOnly != 0 && ev.API.Info().Op != events.OpAlloc {
		return
	}
	raw, known, err := in.RawStack(int(ev.PID), int(ev.TID), events.MaxPyFrames)
	if err != nil {
		s.warn(fmt.Errorf("pid %d: Python frames of its first record: %w", ev.PID, err))
		return
	}
	if !known {
		return // a 3.10 thread other than the main one: BPF alone can tell
	}
	if len(raw) == 0 {
		ev.Flags |= events.FlagNoPython
		return
	}
	ev.Py = ev.Py[:0]
	for _, r := range raw {
		f := events.PyFrame{Code: r.Code, Units: r.Units}
		if r.Entry {
			f.Flags = events.PyEntry
		}
		ev.Py = append(ev.Py, f)
	}
	ev.Flags |= events.FlagPython | events.FlagPyHead // as BPF lays them out (enrich re-encodes: raw has none)
}

// resolvePython reads what the code objects of ev's Python frames are
// (file, function, line), for those not read before, into the process's
// table (in the model, from its first event with Python facts on), and
// writes them to the trace: code objects live in the process and may be
// freed once it moves on, so they are read now, before the event itself
// is written, with or without a trace file (the live views name them from
// the table).
func (s *session) resolvePython(ev *events.Event, lp *liveProc) {
	if lp.py == nil || ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		return
	}
	table := lp.p.Py
	if table == nil {
		table = pyframes.NewTable(lp.py.Eval)
		table.Minor = lp.py.Minor
		lp.p.Py = table
		if s.opts.Observer != nil {
			s.opts.Observer.Python(ev.PID, table)
		}
	}
	var out []pyframes.Code
	var m *pystack.Mem
	for _, f := range ev.Py {
		if table.Has(f.Code, f.Units) {
			continue
		}
		c := pyframes.Code{Code: f.Code, Units: f.Units}
		if m == nil {
			var err error
			if m, err = pystack.OpenMem(int(ev.PID)); err != nil {
				c.Error = err.Error()
				s.countPython(c)
				table.Put(c)
				out = append(out, c)
				continue
			}
			defer m.Close()
		}
		fr, err := lp.py.Code(m, f.Code, int64(f.Units))
		if err != nil {
			c.Error = err.Error()
		}
		c.File, c.Function, c.Line = fr.File, fr.Function, fr.Line
		s.countPython(c)
		table.Put(c)
		out = append(out, c)
	}
	if len(out) == 0 || s.w == nil {
		return
	}
	if err := s.w.WritePython(&tracefile.Python{PID: ev.PID, Codes: procmodel.PyCodesFile(out)}); err != nil {
		s.warn(err)
	}
}

// countPython counts a Python frame read, and whether it stayed
// unresolved (Result.UnresolvedPython).
func (s *session) countPython(c pyframes.Code) {
	s.pyFrames++
	if c.Error != "" {
		s.pyUnresolved++
	}
}
