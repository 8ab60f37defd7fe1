package record

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Python frames without stopping anyone. BPF walks a CPython thread's
// frames at each allocation once the reader has told it the process's
// layout (setPython), and captures each code object the first time a
// record shows it (bpf/pycode.h), in a record before that one: frames are
// named from the captures (pycode), and from the process's memory where a
// capture lacks something (a long name, a line table past its bound).
// What neither names is left unresolved, counted.
//
// The layout must be known before the process's first allocation, for its
// first records to carry frames: a --pid process is looked at when tracing
// starts, a launched command at its exec, any traced process again when
// its loader maps libraries (notes.go); all of them before their first
// record. A record made before (an interpreter mapped and used within the
// moment the reader takes, or a whole process run and gone while the
// reader was behind: an interpreter file BPF was not taught yet, in a
// container's root that went with it) has no Python frames: absent, and
// counted (unwalked).

// detectPython gives a process first seen (capture) the interpreter found
// for it before (early), or looks for CPython 3.10 to 3.15 in its
// mappings now and tells BPF how to walk its threads' frames. It writes
// what it found to the trace.
func (s *session) detectPython(pid uint32, lp *liveProc, root string, maps []proc.Mapping) {
	if lp.py != nil || lp.pyTried || s.opts.NoPythonFrames {
		return
	}
	l := s.lifeOf(pid)
	in, known := l.early, l.earlyTried
	l.early, l.earlyTried = nil, false
	if !known || in == nil {
		var err error
		if in, err = s.setPython(pid, root, maps, false); err != nil {
			lp.pyTried = true // a message once; its mappings will not change that
			s.warn(err)
			return
		}
	}
	if in == nil {
		return // none yet: a later load of libpython (notes.go) looks again
	}
	lp.pyTried = true
	lp.py = in
	if s.w != nil {
		if err := s.w.WritePython(&tracefile.Python{PID: pid, Minor: in.Minor, Eval: in.Eval}); err != nil {
			s.warn(err)
		}
	}
}

// setPython finds the interpreter in a process's mappings and tells BPF
// how to walk its threads' frames, and how to walk those of any process
// that maps its file later (pyFileSet.learn); nil and no error where it
// runs none.
func (s *session) setPython(pid uint32, root string, maps []proc.Mapping, wait bool) (*pystack.Interp, error) {
	in, err := pystack.DetectQuick(root, maps)
	if err != nil {
		// Without the PID: said once per interpreter (warn keeps one of
		// each text), not once for each of a node's processes running it.
		return nil, fmt.Errorf("interpreter not read, Python frames left out of the processes that run it: %w", err)
	}
	if in == nil {
		return nil, nil
	}
	// BPF walks from the moment it has the layout; what merging the
	// frames into native stacks needs besides comes after.
	defer in.Finish()
	if s.tr != nil {
		o, err := in.BPF()
		if err != nil {
			return nil, fmt.Errorf("python layout of pid %d: %w", pid, err)
		}
		var file *proc.Mapping // the interpreter's
		for i := range maps {
			if maps[i].Path == in.Path && maps[i].File() {
				file = &maps[i]
				break
			}
		}
		if file != nil {
			if id, ok := file.ID(); ok {
				s.pyFiles.countFrees(in, root+in.Path, id, &o, wait)
			}
		}
		if err := s.tr.SetPython(pid, &o); errors.Is(err, loader.ErrMapFull) {
			// Said once, whichever process: the summary counts them.
			s.res.MapsFull++
			return nil, errPyProcsFull
		} else if err != nil {
			return nil, err
		}
		s.lifeOf(pid).layout = true
		if file != nil {
			check := ""
			if root == "" || root == "/" {
				check = in.Path // a host file: the sweep checks it is still this file
			}
			if err := s.pyFiles.learn(file.Dev, file.Inode, root+in.Path, in, check); err != nil {
				s.warn(err)
			}
		}
	}
	return in, nil
}

// errPyProcsFull says BPF's table of CPython processes is full of living
// ones: one more process's Python frames are left out (counted).
var errPyProcsFull = errors.New("a process's Python frames left out: BPF's table of CPython processes is full of living ones (counted in the summary and the agent's cudatrace_bpf_map_full_total)")

// learnCommandPython tells BPF, before a launched command starts, the
// layout of the interpreter it runs, if it is a python (its executable,
// or the libpython it needs): BPF gives it to the process as its loader
// maps the file, and its first allocations get their frames however soon
// they come.
func (s *session) learnCommandPython(command []string) {
	if len(command) == 0 || s.opts.NoPythonFrames {
		return
	}
	if exe, err := exec.LookPath(command[0]); err == nil {
		s.pyFiles.learnFiles(pystack.InterpreterFiles("", exe, os.Getenv("LD_LIBRARY_PATH")))
	}
}

// learnExecPython does so at a traced process's exec, for the file it
// runs now (file, as exec was given it): it is found in the process's
// own tree, a container's through /proc/PID/root, while it lives. A
// process whose loader maps the file after the reader got here (a
// libpython, a dlopen) gets the layout in BPF at that load.
func (s *session) learnExecPython(pid uint32, file string) {
	if s.opts.NoPythonFrames || !filepath.IsAbs(file) {
		return
	}
	root, err := proc.RootDir(int(pid), nil)
	if err != nil {
		return // gone
	}
	ld := ""
	if env, err := proc.Environ(int(pid)); err == nil {
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
				ld = v
			}
		}
	}
	s.pyFiles.learnFiles(pystack.InterpreterFiles(root, file, ld))
}

// detectEarly looks for CPython in a process not captured yet (a --pid
// process when tracing starts, a launched or traced process at its exec or
// when its loader maps libraries), so that BPF walks its first
// allocation's frames too. What it finds waits in its life (early) for the
// process's first capture (detectPython); a process without CPython yet
// is looked at again at its next load. root is where its paths are
// opened (proc.RootDir: a container's name its own files), maps its
// mappings.
//
// wait (a --pid process as tracing starts, not a process the reader
// follows) has the layout wait for the interpreter's code_dealloc probe
// (countFrees), so that it is marked from the first.
func (s *session) detectEarly(pid uint32, root string, maps []proc.Mapping, wait bool) {
	if s.opts.NoPythonFrames {
		return
	}
	l := s.lifeOf(pid)
	if l.early != nil {
		return
	}
	in, err := s.setPython(pid, root, maps, wait)
	if err != nil {
		s.warn(err)
	}
	if in == nil && err == nil {
		return
	}
	l.early, l.earlyTried = in, true // nil too, with an error: tried
}

// pycode takes a code object's capture (bpf/pycode.h), made before the
// record that showed it, into the process's captures (pystack.Captures:
// one at an address whose last capture had another identity renews its
// frames in the process's table).
func (s *session) pycode(raw []byte, ev *events.Event) {
	lp := s.track(ev)
	if lp.py == nil {
		return // its layout dropped (an exec) after the capture was made
	}
	var c events.PyCodeCapture
	if err := events.DecodePyCode(raw, ev, &c); err != nil {
		s.warn(err)
		return
	}
	lp.codes.Put(lp.py, &c)
	s.pyCaptured++
}

// resolvePython names the code objects of ev's Python frames (file,
// function, line), for those not named before, into the process's table
// (in the model, from its first event with Python facts on), and writes
// them to the trace before the event itself, with or without a trace file
// (the live views name them from the table).
func (s *session) resolvePython(ev *events.Event, lp *liveProc) {
	if ev.Flags&(events.FlagPython|events.FlagNoPython) == 0 {
		if s.unwalked(ev, lp) {
			s.pyUnwalked++
		}
		return
	}
	lp.walked = true
	if lp.py == nil {
		// BPF walked its frames (it had the interpreter file's layout),
		// but the reader never read the process's interpreter (gone
		// before it could): the frames cannot be named, and are left out,
		// counted.
		if len(ev.Py) > 0 {
			s.pyNoInterp++
		}
		return
	}
	table := lp.p.Py
	if table == nil {
		table = pystack.NewTable(lp.py.Eval)
		table.Minor = lp.py.Minor
		lp.p.Py = table
		if s.opts.Observer != nil {
			s.opts.Observer.Python(ev.PID, table)
		}
	}
	var out []pystack.Code
	for _, f := range ev.Py {
		if !lp.codes.Renewed(f.Code) && table.Has(f.Code, f.Units) {
			continue
		}
		c, read := lp.codes.Name(lp.py, int(ev.PID), f)
		if read {
			s.pyRead++
		}
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

// unwalked says whether ev, a record BPF walked no Python frames for
// (it had no layout for its process), is an allocation of a process that
// runs CPython: its frames are missing, not absent from the program. So
// it is where the reader found the interpreter (after BPF made the
// record: the process allocated before the reader got to it), and where
// the process was gone before the reader could look, its interpreter
// never found but its program or a library it mapped named as one
// (IsReadName): a python3.X run in a root of its own that exited, root
// and all, while the reader was behind. A process looked at while it ran
// and found running none has none (or had its warning: a version not
// read, BPF's table full). Once BPF has walked a record of the process it
// has its layout, and walks every later one: a record without frames
// after that is one whose walk a preempting probe spoiled, which BPF
// counts itself (python_preempted).
func (s *session) unwalked(ev *events.Event, lp *liveProc) bool {
	if s.opts.NoPythonFrames || lp.walked || ev.API.Info().Op != events.OpAlloc {
		return false
	}
	if lp.py != nil {
		return true
	}
	if !lp.exited {
		return false
	}
	if lp.namedPy == 0 {
		lp.namedPy = -1
		if s.namedPython(ev.PID, lp.p.Current()) {
			lp.namedPy = 1
		}
	}
	return lp.namedPy > 0
}

// namedPython says whether process pid's program (its exec note's, or
// capture c's) or a file c shows mapped is named as an interpreter
// cudatrace reads (pystack.IsReadName).
func (s *session) namedPython(pid uint32, c *procmodel.Capture) bool {
	if pystack.IsReadName(s.lifeOf(pid).exe) {
		return true
	}
	if c == nil {
		return false
	}
	return pystack.IsReadName(c.Exe) || slices.ContainsFunc(c.Maps, func(m proc.Mapping) bool { return pystack.IsReadName(m.Path) })
}

// countPython counts a Python frame named, and whether it stayed
// unresolved (Result.UnresolvedPython).
func (s *session) countPython(c pystack.Code) {
	s.pyFrames++
	if c.Error != "" {
		s.pyUnresolved++
	}
}
