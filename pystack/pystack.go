package pystack

import (
	"bytes"
	"cmp"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// Frame is one Python frame, innermost first in a stack.
type Frame struct {
	File     string
	Function string // co_qualname from 3.11, co_name before
	Line     int    // 0 when the instruction has no line
}

// Interp is one process's interpreter: where its runtime state is and how
// its structures are laid out.
type Interp struct {
	Minor   int    // 10 to 15: CPython 3.Minor
	Path    string // libpython or the python executable
	runtime uint64 // address of _PyRuntime in the process
	off     offsets
	// types are the addresses of PyCode_Type, PyUnicode_Type and
	// PyBytes_Type in the process (0 where the build does not name one):
	// what a code object read late must still point to (codeFrame).
	types objTypes
	// Eval are the address ranges of the interpreter loop in the process
	// (interpreterLoop).
	Eval [][2]uint64
	base uint64       // the load bias of the file the interpreter is in
	file string       // where it is read from, until Finish read its full symbol table
	want *proc.FileID // the file it must be there, when its mapping said
	// codeFree is the file offset of code_dealloc (CodeFreeSite), 3.10 to
	// 3.13; 0: not found.
	codeFree uint64
}

// offsets are the byte offsets the walk needs; -1 where the version has
// no such field.
type offsets struct {
	interpHead     int64 // _PyRuntime.interpreters.head
	mainThread     int64 // _PyRuntime.main_thread (3.10: tells the main thread's state)
	interpThreads  int64 // PyInterpreterState.tstate_head (3.10) / threads.head
	tsNext         int64
	tsNativeID     int64 // native_thread_id (3.11+)
	tsThreadID     int64 // thread_id (pthread_t)
	tsFrame        int64 // 3.10: frame; 3.13: current_frame
	tsCFrame       int64 // 3.11, 3.12: cframe
	cfCurrent      int64 // _PyCFrame.current_frame
	frPrevious     int64 // f_back (3.10) / previous
	frCode         int64 // f_code / f_executable
	frInstr        int64 // f_lasti (3.10, an int) / prev_instr / instr_ptr
	frOwner        int64 // 3.12+
	frEntry        int64 // 3.11: is_entry
	coFilename     int64
	coName         int64
	coQualname     int64
	coFirstLine    int64
	coLinetable    int64
	coCodeAdaptive int64
	bytesData      int64 // PyBytesObject.ob_sval
	strLength      int64 // PyASCIIObject.length
	strState       int64
	asciiSize      int64 // sizeof(PyASCIIObject): where compact ASCII data starts
	// From _Py_DebugOffsets alone (3.14 on; 0 where not known: neither is
	// a structure's first member): PyThreadState.interp, and
	// PyInterpreterState._code_object_generation, the count of code
	// objects freed that spares BPF the identities' reads (bpf/pycode.h
	// py_check).
	tsInterp      int64
	interpCodeGen int64
}

// objTypes are the type objects a code object and its parts must have.
type objTypes struct{ code, str, bytes uint64 }

var libRe = regexp.MustCompile(`(?:^|/)(?:libpython|python)3\.(\d+)(t?)(?:\.so[.0-9]*|d?)$`)

// DetectQuick finds CPython 3.10 to 3.15 in a process's mappings. It
// returns nil and no error when the process runs no such interpreter.
// root is where the process's paths are opened under: "" for a process
// that sees the caller's files, /proc/PID/root (proc.RootPath) for a
// container's; Interp.Path and messages keep the path the process sees.
// It reads the interpreter's dynamic symbols alone, where they name what
// the walk needs (they do in shared and in statically linked builds,
// which export their API): its layout is then
// known at once, for the walk in BPF to start before the process's first
// allocation, and Finish adds the parts of the interpreter loop only the
// full symbol table names (its .cold part, 3.14's tail-call handlers),
// which a large build's takes tens of milliseconds to read.
func DetectQuick(root string, maps []proc.Mapping) (*Interp, error) {
	for _, m := range maps {
		sm := libRe.FindStringSubmatch(m.Path)
		if sm == nil || !m.File() {
			continue
		}
		minor, _ := strconv.Atoi(sm[1])
		if _, ok := versions[minor]; !ok {
			return nil, fmt.Errorf("%s: CPython 3.%d: only 3.%d to 3.%d are read", m.Path, minor, oldestMinor, newestMinor)
		}
		if sm[2] == "t" {
			return nil, fmt.Errorf("%s: CPython 3.%dt is a free-threaded build, whose frames cudatrace does not read: "+
				"run the program on the default build (python3.%d) for its Python frames", m.Path, minor, minor)
		}
		in, err := open(root, m.Path, minor, maps)
		if errors.Is(err, errNoRuntime) {
			continue // the executable of a shared-libpython build
		}
		return in, err
	}
	return nil, nil
}

var errNoRuntime = errors.New("no _PyRuntime symbol")

// symbolFacts are what the interpreter's symbols say.
type symbolFacts struct {
	runtime uint64
	types   objTypes
	eval    [][2]uint64
}

func scanSymbols(syms []elf.Symbol) symbolFacts {
	var sf symbolFacts
	for _, s := range syms {
		if s.Section == elf.SHN_UNDEF {
			continue
		}
		switch s.Name {
		case "_PyRuntime":
			sf.runtime = cmp.Or(sf.runtime, s.Value)
		case "PyCode_Type":
			sf.types.code = cmp.Or(sf.types.code, s.Value)
		case "PyUnicode_Type":
			sf.types.str = cmp.Or(sf.types.str, s.Value)
		case "PyBytes_Type":
			sf.types.bytes = cmp.Or(sf.types.bytes, s.Value)
		}
		if interpreterLoop(s.Name) && s.Size > 0 &&
			!slices.Contains(sf.eval, [2]uint64{s.Value, s.Value + s.Size}) {
			sf.eval = append(sf.eval, [2]uint64{s.Value, s.Value + s.Size})
		}
	}
	return sf
}

// open reads the interpreter at path, under root; with maps, only the very
// file they map there (device and inode) is read. It is opened through
// proc.Open: never blocking, only a regular file, a path under
// /proc/PID/root resolved inside that root.
func open(root, path string, minor int, maps []proc.Mapping) (*Interp, error) {
	var want *proc.FileID
	for _, m := range maps {
		if id, ok := m.ID(); ok && m.Path == path {
			want = &id
			break
		}
	}
	f, err := proc.OpenELF(root+path, want)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, _ := f.DynamicSymbols()
	sf := scanSymbols(syms)
	full := false
	if sf.runtime == 0 || sf.types.code == 0 || sf.types.str == 0 || sf.types.bytes == 0 || len(sf.eval) == 0 {
		all, _ := f.Symbols()
		syms = append(all, syms...)
		sf, full = scanSymbols(syms), true
	}
	runtime, eval, types := sf.runtime, sf.eval, sf.types
	if runtime == 0 {
		return nil, errNoRuntime
	}
	base, ok := uint64(0), true // a file, not mapped anywhere (DetectFile)
	if maps != nil {
		if base, ok = loadBias(f.File, path, maps); !ok {
			return nil, fmt.Errorf("%s: not mapped as its headers say", path)
		}
	}
	// 3.13 on describe their own layout in _Py_DebugOffsets, at the start of
	// _PyRuntime. Release builds of 3.10 to 3.12 for x86-64 take the
	// table of their minor version (table.go), with or without DWARF: it
	// is what their DWARF says (TestOffsetTables), and it is ready at
	// once, where parsing a build's DWARF took 140-520 ms here, time in
	// which a process just started makes its first allocations with no
	// walk in BPF yet (record/python.go). Other builds (debug builds,
	// pre-releases, other architectures) take their DWARF's.
	off, freeThreaded, ok := debugOffsets(f.File, runtime, minor)
	if freeThreaded {
		return nil, fmt.Errorf("%s: CPython 3.%d built free-threaded (--disable-gil), whose frames cudatrace does not read: "+
			"run the program on a build with the GIL for its Python frames", path, minor)
	}
	if !ok {
		var terr error
		if off, terr = tableOffsets(f.File, syms, minor); terr == nil {
			ok = true
		} else {
			derr := errors.New("no DWARF")
			if f.Section(".debug_info") != nil {
				if d, err := f.DWARF(); err != nil {
					derr = fmt.Errorf("its DWARF: %w", err)
				} else if off, derr = dwarfOffsets(d, minor); derr == nil {
					ok = true
				}
			}
			if !ok {
				return nil, fmt.Errorf("%s: no structure offsets for this CPython 3.%d build: %v, and %v; "+
					"Python frames need a build with DWARF (pyenv's, or one built with -g), an x86-64 or arm64 release build "+
					"of 3.10 to 3.12, or a 3.13 to 3.%d one", path, minor, derr, terr, newestMinor)
			}
		}
	}
	for i := range eval {
		eval[i][0] += base
		eval[i][1] += base
	}
	for _, t := range []*uint64{&types.code, &types.str, &types.bytes} {
		if *t != 0 {
			*t += base
		}
	}
	in := &Interp{Minor: minor, Path: path, runtime: base + runtime, off: off, types: types, Eval: eval, base: base}
	if off.interpCodeGen <= 0 {
		// Not found: each frame's identity read at every record, as
		// before the probe; nothing to say.
		in.codeFree, _ = codeFreeSite(f.File, sf.types.code, syms)
	}
	if !full {
		in.file, in.want = root+path, want
	}
	return in, nil
}

// Finish adds to Eval the parts of the interpreter loop that only the
// full symbol table names (DetectQuick); a file that cannot be read
// again leaves Eval as it is.
func (in *Interp) Finish() {
	if in.file == "" {
		return
	}
	path := in.file
	in.file = ""
	f, err := proc.OpenELF(path, in.want)
	if err != nil {
		return
	}
	defer f.Close()
	syms, _ := f.Symbols()
	for _, r := range scanSymbols(syms).eval {
		r = [2]uint64{r[0] + in.base, r[1] + in.base}
		if !slices.Contains(in.Eval, r) {
			in.Eval = append(in.Eval, r)
		}
	}
}

// loadBias is what the process added to the file's virtual addresses.
func loadBias(f *elf.File, path string, maps []proc.Mapping) (uint64, bool) {
	for _, m := range maps {
		if m.Path != path {
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && m.Offset >= p.Off && m.Offset < p.Off+p.Filesz {
				return m.Start - (m.Offset - p.Off) - p.Vaddr, true
			}
		}
	}
	return 0, false
}

// debugOffsets reads the _Py_DebugOffsets of 3.13 and later (Include/
// internal/pycore_debug_offsets.h), the initial value of _PyRuntime's
// first member in the file's data: the "xdebugpy" cookie, the version,
// whether the build is free-threaded, then sections of u64 offsets, each
// led by the structure's size. ok is false where the build has none
// (before 3.13) or it is not the layout of its version read here
// (versions; its sections' sizes and fixed members are checked, so a
// release that moved them is refused, not misread); a free-threaded build
// is ok, with freeThreaded set (its frames are not read: open refuses it).
func debugOffsets(f *elf.File, runtime uint64, minor int) (o offsets, freeThreaded, ok bool) {
	const words = 93 // through 3.15's unicode_object.asciiobject_size
	d := versions[minor].debug
	if d == nil {
		return o, false, false
	}
	var raw [words * 8]byte
	found := false
	for _, sec := range f.Sections {
		if sec.Type == elf.SHT_PROGBITS && runtime >= sec.Addr && runtime+uint64(len(raw)) <= sec.Addr+sec.Size {
			if _, err := sec.ReadAt(raw[:], int64(runtime-sec.Addr)); err != nil {
				return o, false, false
			}
			found = true
			break
		}
	}
	w := func(i int) int64 { return int64(binary.LittleEndian.Uint64(raw[i*8:])) }
	version := w(1) // PY_VERSION_HEX
	if !found || string(raw[:8]) != "xdebugpy" || version>>16 != int64(0x0300|minor) {
		return o, false, false
	}
	if w(2) != 0 {
		return o, true, true
	}
	o = offsets{
		interpHead: w(5), mainThread: -1, interpThreads: w(9),
		tsNext: w(d.ts + 2), tsNativeID: w(d.ts + d.tsNativeID), tsThreadID: w(d.ts + d.tsThreadID), tsFrame: w(d.ts + 4),
		tsCFrame: -1, cfCurrent: -1,
		frPrevious: w(d.frame + 1), frCode: w(d.frame + 2), frInstr: w(d.frame + 3), frOwner: w(d.frame + 5), frEntry: -1,
		coFilename: w(d.code + 1), coName: w(d.code + 2), coQualname: w(d.code + 3), coLinetable: w(d.code + 4),
		coFirstLine: w(d.code + 5), coCodeAdaptive: w(d.code + 9),
		bytesData: w(d.bytes + 2), strState: w(d.unicode + 1), strLength: w(d.unicode + 2), asciiSize: w(d.unicode + 3),
	}
	if d.interpCodeGen > 0 {
		o.tsInterp, o.interpCodeGen = w(d.ts+3), w(d.interpCodeGen)
	}
	// Each section's members lie within its structure's size; the object
	// sections' fixed members are where every 64-bit build has them.
	within := func(size int64, offs ...int64) bool {
		for _, v := range offs {
			if v < 0 || v >= size {
				return false
			}
		}
		return size > 0 && size < 1<<16
	}
	// (PyInterpreterState is larger than a section's other structures:
	// 220 KiB in 3.14.)
	if d.interpCodeGen > 0 && (!within(w(d.ts), o.tsInterp) || o.interpCodeGen <= 0 || o.interpCodeGen+8 > w(6) || w(6) >= 1<<24) ||
		!within(w(d.ts), o.tsNext, o.tsNativeID, o.tsThreadID, o.tsFrame) ||
		!within(w(d.frame), o.frPrevious, o.frCode, o.frInstr, o.frOwner) ||
		!within(w(d.code), o.coFilename, o.coName, o.coQualname, o.coLinetable, o.coFirstLine, o.coCodeAdaptive) ||
		w(d.pyobject) != 16 || w(d.pyobject+1) != 8 || w(d.bytes+1) != 16 || w(d.unicode+2) != 16 ||
		!within(w(d.bytes), o.bytesData) || !within(w(d.unicode), o.strState, o.strLength, o.asciiSize) {
		return o, false, false
	}
	return o, false, true
}

// interpreterLoop says whether the function named name is part of the
// interpreter loop: _PyEval_EvalFrameDefault and its compiler-split .cold
// part, and, in CPython 3.14 built with the tail-calling interpreter
// (clang, --with-tail-call-interp), the handler functions each
// instruction and label is there (_TAIL_CALL_LOAD_FAST,
// _TAIL_CALL_start_frame, their .cold parts), which the loop enters and
// leaves by tail calls: one handler frame stands above the loop's entry
// frame (Merge takes the two as one).
func interpreterLoop(name string) bool {
	return name == "_PyEval_EvalFrameDefault" || name == "_PyEval_EvalFrameDefault.cold" ||
		strings.HasPrefix(name, "_TAIL_CALL_")
}

// structs indexes the DWARF structures by tag or typedef name.
func structs(d *dwarf.Data, names map[string]bool) map[string]*dwarf.StructType {
	out := map[string]*dwarf.StructType{}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil || e == nil {
			return out
		}
		if e.Tag != dwarf.TagStructType && e.Tag != dwarf.TagTypedef {
			if e.Tag == dwarf.TagCompileUnit || e.Tag == dwarf.TagPartialUnit {
				continue
			}
			r.SkipChildren()
			continue
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		if !names[name] || out[name] != nil || e.Val(dwarf.AttrDeclaration) != nil {
			if e.Children {
				r.SkipChildren()
			}
			continue
		}
		t, err := d.Type(e.Offset)
		if e.Children {
			r.SkipChildren()
		}
		if err != nil {
			continue
		}
		if td, ok := t.(*dwarf.TypedefType); ok {
			t = td.Type
		}
		if st, ok := t.(*dwarf.StructType); ok && !st.Incomplete {
			out[name] = st
			if len(out) == len(names) {
				return out
			}
		}
	}
}

// field is the offset of a dotted member path in st; -1 when absent.
func field(st *dwarf.StructType, path string) int64 {
	var off int64
	for _, name := range strings.Split(path, ".") {
		if st == nil {
			return -1
		}
		var next *dwarf.StructType
		found := false
		for _, f := range st.Field {
			if f.Name == name {
				off += f.ByteOffset
				found = true
				t := f.Type
				if td, ok := t.(*dwarf.TypedefType); ok {
					t = td.Type
				}
				next, _ = t.(*dwarf.StructType)
				break
			}
		}
		if !found {
			return -1
		}
		st = next
	}
	return off
}

func dwarfOffsets(d *dwarf.Data, minor int) (offsets, error) {
	s := structs(d, map[string]bool{"pyruntimestate": true, "_is": true, "_ts": true, "_frame": true,
		"_PyInterpreterFrame": true, "_PyCFrame": true, "PyCodeObject": true, "PyBytesObject": true, "PyASCIIObject": true})
	var o offsets
	rt, is, ts, code := s["pyruntimestate"], s["_is"], s["_ts"], s["PyCodeObject"]
	o.interpHead = field(rt, "interpreters.head")
	o.mainThread = field(rt, "main_thread")
	o.tsNext = field(ts, "next")
	o.tsNativeID = field(ts, "native_thread_id")
	o.tsThreadID = field(ts, "thread_id")
	o.tsFrame, o.tsCFrame, o.cfCurrent, o.frOwner, o.frEntry = -1, -1, -1, -1, -1
	o.coQualname = field(code, "co_qualname")
	o.coFilename = field(code, "co_filename")
	o.coName = field(code, "co_name")
	o.coFirstLine = field(code, "co_firstlineno")
	o.coLinetable = field(code, "co_linetable")
	o.coCodeAdaptive = field(code, "co_code_adaptive")
	o.bytesData = field(s["PyBytesObject"], "ob_sval")
	o.strLength = field(s["PyASCIIObject"], "length")
	o.strState = field(s["PyASCIIObject"], "state")
	if a := s["PyASCIIObject"]; a != nil {
		o.asciiSize = a.ByteSize
	}
	frames := versions[minor].frames
	switch frames {
	case frameObjects:
		o.interpThreads = field(is, "tstate_head")
		o.tsFrame = field(ts, "frame")
		fr := s["_frame"]
		o.frPrevious, o.frCode, o.frInstr = field(fr, "f_back"), field(fr, "f_code"), field(fr, "f_lasti")
	default:
		o.interpThreads = field(is, "threads.head")
		fr := s["_PyInterpreterFrame"]
		o.frPrevious = field(fr, "previous")
		if frames >= frameCurrent {
			o.tsFrame = field(ts, "current_frame")
			o.frCode, o.frInstr = field(fr, "f_executable"), field(fr, "instr_ptr")
		} else {
			o.tsCFrame = field(ts, "cframe")
			o.cfCurrent = field(s["_PyCFrame"], "current_frame")
			o.frCode, o.frInstr = field(fr, "f_code"), field(fr, "prev_instr")
		}
		if frames == frameEntry {
			o.frEntry = field(fr, "is_entry")
		}
		if frames >= frameOwner {
			o.frOwner = field(fr, "owner")
		}
	}
	need := map[string]int64{"interpreters.head": o.interpHead, "thread list": o.interpThreads, "next": o.tsNext,
		"frame previous": o.frPrevious, "frame code": o.frCode, "frame instruction": o.frInstr,
		"co_filename": o.coFilename, "co_name": o.coName, "co_firstlineno": o.coFirstLine, "co_linetable": o.coLinetable,
		"ob_sval": o.bytesData, "PyASCIIObject.state": o.strState}
	if frames != frameObjects {
		need["native_thread_id"], need["co_code_adaptive"] = o.tsNativeID, o.coCodeAdaptive
	}
	for name, v := range need {
		if v < 0 {
			return o, fmt.Errorf("CPython 3.%d: no %s in its DWARF", minor, name)
		}
	}
	return o, nil
}

// SystemInterpreters are the interpreter files installed where Pythons
// usually are (the system's, /usr/local's, conda's, pyenv's, a virtual
// environment's base), for DetectFile: candidates by name, each once.
func SystemInterpreters() []string {
	home, _ := os.UserHomeDir()
	var patterns []string
	for _, dir := range []string{"/usr", "/usr/local", "/opt/conda", filepath.Join(home, ".pyenv/versions/*"),
		filepath.Join(home, "miniconda3"), filepath.Join(home, "anaconda3"), os.Getenv("CONDA_PREFIX")} {
		if dir == "" {
			continue
		}
		patterns = append(patterns, filepath.Join(dir, "bin/python3.*"), filepath.Join(dir, "lib/libpython3.*.so*"),
			filepath.Join(dir, "lib/*-linux-gnu/libpython3.*.so*"))
	}
	var out []string
	seen := map[string]bool{}
	for _, p := range patterns {
		matches, _ := filepath.Glob(p)
		for _, m := range matches {
			if r, err := filepath.EvalSymlinks(m); err == nil && !seen[r] && libRe.MatchString(r) && fileExists(r) {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// IsReadName says whether path, by its name alone, is the file of an
// interpreter whose frames cudatrace reads: a python3.X executable or a
// libpython3.X, X in versions, not a free-threaded build. It is what is
// left to tell by when the file cannot be opened (its process gone, with
// the container that held it).
func IsReadName(path string) bool {
	sm := libRe.FindStringSubmatch(path)
	if sm == nil || sm[2] == "t" {
		return false
	}
	minor, _ := strconv.Atoi(sm[1])
	_, ok := versions[minor]
	return ok
}

// DetectFile reads CPython 3.10 to 3.15 from an interpreter file (a
// python executable with the runtime linked in, or a libpython) not mapped
// by any process yet: its layout with the file's own addresses (Base 0),
// without the interpreter loop's ranges only a full symbol table gives
// (Finish adds them). nil and no error for a file that is no interpreter
// cudatrace reads.
func DetectFile(path string) (*Interp, error) {
	sm := libRe.FindStringSubmatch(path)
	if sm == nil || sm[2] == "t" {
		return nil, nil
	}
	minor, _ := strconv.Atoi(sm[1])
	if _, ok := versions[minor]; !ok {
		return nil, nil
	}
	in, err := open("", path, minor, nil)
	if errors.Is(err, errNoRuntime) {
		return nil, nil
	}
	return in, err
}

// InterpreterFiles are the interpreter files a program file would run
// with: the file itself, if it is a python executable, and the libpython
// it needs, found as the dynamic loader finds it (its run path, $ORIGIN
// taken; LD_LIBRARY_PATH, as ldLibraryPath gives it; the system's
// directories). root is the tree the program's paths are in: "" for the
// caller's, /proc/PID/root for a container's (the files returned are
// under it). What is not an interpreter DetectFile reads is for the
// caller to leave out.
func InterpreterFiles(root, exe, ldLibraryPath string) []string {
	exe = filepath.Join(root, exe)
	f, err := proc.OpenELF(exe, nil)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := []string{exe}
	needed, _ := f.ImportedLibraries()
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, _ := f.DynString(tag)
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				if strings.Contains(d, "ORIGIN}") || strings.Contains(d, "$ORIGIN") {
					dirs = append(dirs, strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", filepath.Dir(exe)), "$ORIGIN", filepath.Dir(exe)))
				} else if d != "" {
					dirs = append(dirs, filepath.Join(root, d))
				}
			}
		}
	}
	for _, d := range append(filepath.SplitList(ldLibraryPath), "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
		"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/local/lib", "/usr/lib64", "/usr/lib", "/lib64", "/lib") {
		if d != "" {
			dirs = append(dirs, filepath.Join(root, d))
		}
	}
	for _, lib := range needed {
		if !libRe.MatchString(lib) {
			continue
		}
		for _, d := range dirs {
			if p := filepath.Join(d, lib); fileExists(p) {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// fileExists reports whether p reaches a regular file, as proc.Open
// resolves it (under /proc/PID/root, inside that root).
func fileExists(p string) bool {
	f, err := proc.Open(p, nil)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// reader is where a code object's bytes are read: the live process
// (proc.Mem), or what BPF captured of it (captured).
type reader interface {
	ReadAt(b []byte, addr uint64) error
}

// captured serves reads from a capture's parts, each an object's first
// bytes at its address in the process.
type captured struct{ c *events.PyCodeCapture }

func (c captured) parts() [4]part {
	return [4]part{{c.c.Code, c.c.Head}, {c.c.File, c.c.FileBytes}, {c.c.Name, c.c.NameBytes}, {c.c.Table, c.c.TableBytes}}
}

type part struct {
	at   uint64
	data []byte
}

// from is what the part holds from addr on, and whether addr lies in it
// (its end included: nothing from there on).
func (p part) from(addr uint64) ([]byte, bool) {
	if p.at == 0 || addr < p.at || addr-p.at > uint64(len(p.data)) {
		return nil, false
	}
	return p.data[addr-p.at:], true
}

// after is how many bytes the capture holds from addr on: the most any
// one part holds. Parts may overlap (a small line table allocated right
// after its name lies inside the name's capture); their bytes were read
// in the same capture, so any part that holds them will do.
func (c captured) after(addr uint64) uint64 {
	var most uint64
	for _, p := range c.parts() {
		if rest, ok := p.from(addr); ok {
			most = max(most, uint64(len(rest)))
		}
	}
	return most
}

func (c captured) ReadAt(b []byte, addr uint64) error {
	for _, p := range c.parts() {
		if rest, ok := p.from(addr); ok && len(rest) >= len(b) {
			copy(b, rest)
			return nil
		}
	}
	return fmt.Errorf("%d bytes at %#x: %w", len(b), addr, ErrNotCaptured)
}

func readAt(m reader, addr uint64, b []byte) error {
	if err := m.ReadAt(b, addr); err != nil {
		return fmt.Errorf("read %d bytes at %#x: %w", len(b), addr, err)
	}
	return nil
}

func u64(m reader, addr uint64) (uint64, error) {
	var b [8]byte
	err := readAt(m, addr, b[:])
	return binary.LittleEndian.Uint64(b[:]), err
}

// CodeInfo is what names a code object's frames: its file, (qualified)
// name, first line and line table, checked as codeInfo says.
type CodeInfo struct {
	File      string
	Function  string // co_qualname from 3.11, co_name before
	FirstLine int
	units     uint64 // its code units (Py_SIZE, 3.11 on); 0: not known (3.10)
	table     []byte
	// cut: table is the first part of the line table, all a capture took
	// (bpf/pycode.h CT_PYCODE_TABLE): an instruction past what it covers
	// is ErrNotCaptured.
	cut       bool
	locations bool // versions' locations
}

// ErrNotCaptured says a capture of a code object lacks what naming a frame
// of it takes (a name longer than it took, a line table past its bound):
// the caller reads the process instead (Code).
var ErrNotCaptured = errors.New("not in what BPF captured")

// Parse checks and names a code object from what BPF captured of it
// (bpf/pycode.h), with the checks a read from the process gets.
func (in *Interp) Parse(c *events.PyCodeCapture) (*CodeInfo, error) {
	return in.codeInfo(captured{c}, c.Code)
}

// Code resolves a code object of process pid and an instruction in it
// (code units from its first) to a frame: what a walk in BPF recorded,
// read from the process now. The code object must still be alive.
func (in *Interp) Code(pid int, code uint64, units int64) (Frame, error) {
	return in.codeFrame(proc.OpenMem(pid), code, units)
}

// codeFrame reads what code object code is and the line of the
// instruction units code units into it.
func (in *Interp) codeFrame(m reader, code uint64, units int64) (Frame, error) {
	ci, err := in.codeInfo(m, code)
	if err != nil {
		return Frame{}, err
	}
	return ci.Frame(units)
}

// Frame names the instruction units code units into the code object.
func (ci *CodeInfo) Frame(units int64) (Frame, error) {
	if units < 0 || ci.units > 0 && uint64(units) >= ci.units {
		return Frame{}, fmt.Errorf("instruction %d is outside its code object (%d code units)", units, ci.units)
	}
	var line int
	var found bool
	if ci.locations {
		line, found = line311(ci.table, ci.FirstLine, units)
	} else {
		line, found = line310(ci.table, ci.FirstLine, units*2)
	}
	if !found && ci.cut {
		return Frame{}, fmt.Errorf("instruction %d: its line lies past the %d bytes of line table captured: %w", units, len(ci.table), ErrNotCaptured)
	}
	if line < ci.FirstLine || line > maxLine {
		return Frame{}, fmt.Errorf("instruction %d has no line in its code object's table", units)
	}
	return Frame{File: ci.File, Function: ci.Function, Line: line}, nil
}

// codeInfo reads what code object code is. The object is read while the
// process runs on, possibly after it was freed, so everything read is
// checked: the object and its names still have their types, sizes are
// sane, the instruction lies inside the code and has a line at or after
// the code's first, and names are printable text. What fails a check is
// an error (the frame is left unresolved), never a frame with line 0 or a
// garbage name.
func (in *Interp) codeInfo(m reader, code uint64) (*CodeInfo, error) {
	o := &in.off
	if code == 0 || code%8 != 0 {
		return nil, fmt.Errorf("code object address %#x is not one", code)
	}
	if err := in.checkType(m, code, in.types.code, "code object"); err != nil {
		return nil, err
	}
	var err error
	ptr := func(off int64) uint64 {
		if err != nil || off < 0 {
			return 0
		}
		var v uint64
		v, err = u64(m, code+uint64(off))
		return v
	}
	filename, name, qualname, table := ptr(o.coFilename), ptr(o.coName), ptr(o.coQualname), ptr(o.coLinetable)
	if err != nil {
		return nil, err
	}
	ci := &CodeInfo{locations: versions[in.Minor].locations}
	if ci.locations {
		// Py_SIZE of a code object is its number of code units.
		n, err := u64(m, code+16)
		if err != nil {
			return nil, err
		}
		if n == 0 || n > maxObject {
			return nil, fmt.Errorf("a code object of %d code units", n)
		}
		ci.units = n
	}
	var first [4]byte
	if err := readAt(m, code+uint64(o.coFirstLine), first[:]); err != nil {
		return nil, err
	}
	if ci.File, err = in.str(m, filename); err != nil {
		return nil, fmt.Errorf("its file name: %w", err)
	}
	fn := name
	if qualname != 0 {
		fn = qualname
	}
	if ci.Function, err = in.str(m, fn); err != nil {
		return nil, fmt.Errorf("its function name: %w", err)
	}
	if ci.table, ci.cut, err = in.bytesObj(m, table); err != nil {
		return nil, fmt.Errorf("its line table: %w", err)
	}
	ci.FirstLine = int(int32(binary.LittleEndian.Uint32(first[:])))
	if ci.FirstLine < 1 || ci.FirstLine > maxLine {
		return nil, fmt.Errorf("first line %d is not one", ci.FirstLine)
	}
	return ci, nil
}

const (
	maxObject = 1 << 20
	maxLine   = 1 << 24
)

// checkType fails unless the object at obj has type typ (its ob_type);
// typ 0 (the build does not name the type) checks nothing.
func (in *Interp) checkType(m reader, obj, typ uint64, what string) error {
	if obj == 0 {
		return fmt.Errorf("no %s", what)
	}
	if typ == 0 {
		return nil
	}
	t, err := u64(m, obj+8) // PyObject.ob_type
	if err != nil {
		return err
	}
	if t != typ {
		return fmt.Errorf("%#x is no longer a %s (freed)", obj, what)
	}
	return nil
}

// str reads a compact ASCII str (file and function names are); others
// are left unread, an error.
func (in *Interp) str(m reader, obj uint64) (string, error) {
	o := &in.off
	if err := in.checkType(m, obj, in.types.str, "str"); err != nil {
		return "", err
	}
	n, err := u64(m, obj+uint64(o.strLength))
	if err != nil {
		return "", err
	}
	var st [4]byte
	if err := readAt(m, obj+uint64(o.strState), st[:]); err != nil {
		return "", err
	}
	state := binary.LittleEndian.Uint32(st[:])
	if state&(1<<5) == 0 || state&(1<<6) == 0 {
		return "", errors.New("not a compact ASCII str: left unread")
	}
	if n == 0 || n > 4096 {
		return "", fmt.Errorf("a str of %d characters", n)
	}
	b := make([]byte, n)
	if err := readAt(m, obj+uint64(o.asciiSize), b); err != nil {
		return "", err
	}
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return "", fmt.Errorf("str %q is not printable ASCII", b)
		}
	}
	return string(b), nil
}

// bytesObj reads a bytes object's data. From a capture that took only
// its first part, it gives that part, cut.
func (in *Interp) bytesObj(m reader, obj uint64) (b []byte, cut bool, err error) {
	if err := in.checkType(m, obj, in.types.bytes, "bytes object"); err != nil {
		return nil, false, err
	}
	n, err := u64(m, obj+16) // PyVarObject.ob_size
	if err != nil {
		return nil, false, err
	}
	if n > maxObject {
		return nil, false, fmt.Errorf("bytes object of %d bytes at %#x", n, obj)
	}
	data := obj + uint64(in.off.bytesData)
	if c, ok := m.(captured); ok {
		if have := c.after(data); have < n {
			n, cut = have, true
		}
	}
	b = make([]byte, n)
	return b, cut, readAt(m, data, b)
}

// line310 reads 3.10's co_linetable: (bytecode delta, line delta) byte
// pairs, a line delta of -128 meaning no line. off is in bytes.
func line310(t []byte, first int, off int64) (int, bool) {
	line, start := first, int64(0)
	for i := 0; i+1 < len(t); i += 2 {
		end := start + int64(t[i])
		cur := -1
		if d := int8(t[i+1]); d != -128 {
			line += int(d)
			cur = line
		}
		if off >= start && off < end {
			return max(cur, 0), true
		}
		start = end
	}
	return 0, false
}

// line311 reads the location table of 3.11 and later (Objects/
// locations.md): entries of a header byte (code, length in code units)
// and the line delta and columns the code says. off is in code units.
func line311(t []byte, first int, off int64) (int, bool) {
	r := bytes.NewReader(t)
	varint := func() int {
		b, _ := r.ReadByte()
		v, shift := int(b&63), 0
		for b&64 != 0 {
			var err error
			if b, err = r.ReadByte(); err != nil {
				break
			}
			shift += 6
			v |= int(b&63) << shift
		}
		return v
	}
	svarint := func() int {
		v := varint()
		if v&1 != 0 {
			return -(v >> 1)
		}
		return v >> 1
	}
	line, addr := first, int64(0)
	for r.Len() > 0 {
		h, _ := r.ReadByte()
		code, length := int(h>>3)&15, int64(h&7)+1
		cur := line
		switch {
		case code == 15:
			cur = -1
		case code == 14:
			line += svarint()
			varint()
			varint()
			varint()
			cur = line
		case code == 13:
			line += svarint()
			cur = line
		case code >= 10:
			line += code - 10
			r.ReadByte()
			r.ReadByte()
			cur = line
		default:
			r.ReadByte()
		}
		if off >= addr && off < addr+length {
			return max(cur, 0), true
		}
		addr += length
	}
	return 0, false
}
