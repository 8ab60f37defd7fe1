package pystack

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// probeTarget is an installed interpreter: python (a path inside root; ""
// for the host's tree, else run chrooted into root).
type probeTarget struct{ name, root, python string }

// probeVersions are the interpreters TestLayoutProbe runs its probe
// under, one line a case: pyenv's builds (with DWARF), Debian 12's
// python3.11 (no DWARF: the built-in table), and sid's, run chrooted into
// its tree (_Py_DebugOffsets). Each version in versions has one at least
// (TestVersions): a new version is one line here.
var probeVersions = []struct {
	from    probeFrom
	version string
}{
	{pyenv, "3.10"},
	{pyenv, "3.11"},
	{pyenv, "3.12"},
	{pyenv, "3.13"},
	{debian, "3.11"},
	{sid, "3.13"},
	{sid, "3.14"},
	{sid, "3.15"},
}

// probeFrom is where an interpreter of probeVersions is installed.
type probeFrom int

const (
	pyenv  probeFrom = iota // /root/.pyenv/versions (testenv.Python)
	debian                  // the host's /usr/bin/python3.M
	sid                     // a Debian sid tree (testenv.SidPython)
)

// probeTargets runs run for each of probeVersions, each a subtest that
// skips (fails under CI=true) where its interpreter is absent.
func probeTargets(t *testing.T, run func(t *testing.T, pt probeTarget)) {
	for _, pv := range probeVersions {
		v := pv.version
		switch pv.from {
		case pyenv:
			t.Run(v, func(t *testing.T) { run(t, probeTarget{v, "", testenv.Python(t, v)}) })
		case debian:
			t.Run("debian-"+v, func(t *testing.T) {
				python := "/usr/bin/python" + v
				if _, err := os.Stat(python); err != nil {
					testenv.SkipOrFail(t, "%v", err)
				}
				run(t, probeTarget{"debian-" + v, "", python})
			})
		case sid:
			t.Run("sid-"+v, func(t *testing.T) {
				if os.Getuid() != 0 {
					testenv.SkipOrFail(t, "chroot needs root")
				}
				root, python := testenv.SidPython(t, v)
				run(t, probeTarget{"sid-" + v, root, python})
			})
		}
	}
}

// TestVersions: each version read is probed (probeVersions), the
// versions are one run, oldest to newest, and each entry's facts agree
// with one another.
func TestVersions(t *testing.T) {
	probed := map[int]bool{}
	for _, pv := range probeVersions {
		var minor int
		if _, err := fmt.Sscanf(pv.version, "3.%d", &minor); err != nil {
			t.Fatalf("probeVersions: %q: %v", pv.version, err)
		}
		if _, ok := versions[minor]; !ok {
			t.Errorf("probeVersions: %s is not in versions", pv.version)
		}
		probed[minor] = true
	}
	for minor := oldestMinor; minor <= newestMinor; minor++ {
		v, ok := versions[minor]
		switch {
		case !ok:
			t.Errorf("3.%d: not in versions, between 3.%d and 3.%d", minor, oldestMinor, newestMinor)
		case !probed[minor]:
			t.Errorf("3.%d: no interpreter in probeVersions: TestLayoutProbe does not check it", minor)
		case v.debug != nil && v.table != nil:
			t.Errorf("3.%d: both _Py_DebugOffsets and a table", minor)
		case v.frames >= frameOwner && v.entryOwner == 0:
			t.Errorf("3.%d: its frames have owners, but no entry frame's owner", minor)
		case v.frames >= frameEntry && !v.locations:
			t.Errorf("3.%d: _PyInterpreterFrame without 3.11's location table", minor)
		}
	}
}

// Every supported interpreter installed here runs testdata/layoutprobe.py,
// which reads its own memory at the offsets pystack took for its build (its
// _Py_DebugOffsets, its DWARF, or the table of its minor version) and
// compares what it finds with what the interpreter says of itself: its
// thread's ids, its thread state in the interpreter's thread list, each
// frame's code object, instruction, owner (a generator's, a C call's entry
// frame) or entry flag, and each code object's names, first line and line
// table. pystack then names each frame from the bytes of its code object
// as the probe read them, with its own code (the line table's format, the
// string and bytes layouts), and the names and line must be those CPython
// gives. A wrong offset fails here rather than misnaming frames: each of the
// walk's offsets moved by 8 fails it.
func TestLayoutProbe(t *testing.T) {
	probeTargets(t, func(t *testing.T, pt probeTarget) {
		in := probeInterp(t, pt)
		if problems := probeLayout(t, pt, in, in.off); len(problems) > 0 {
			t.Fatalf("CPython 3.%d (%s), offsets %+v:\n%s", in.Minor, in.Path, in.off, strings.Join(problems, "\n"))
		}
		if testing.Short() {
			return
		}
		for _, fd := range probeFields {
			wrong := in.off
			f := fd.at(&wrong)
			if *f < 0 || *f == 0 && (f == &wrong.tsInterp || f == &wrong.interpCodeGen) {
				continue // not in this version
			}
			step := int64(8) // the next field (a byte field's next byte)
			if fd.byte {
				step = 1
			} else if f == &wrong.interpHead {
				step = -8
			}
			*f += step
			if problems := probeLayout(t, pt, in, wrong); len(problems) == 0 {
				t.Errorf("CPython 3.%d: %s moved by %d passed the probe", in.Minor, fd.name, step)
			}
		}
	})
}

// probeFields are the offsets the probe checks, each made wrong in turn.
var probeFields = []struct {
	name string
	at   func(*offsets) *int64
	byte bool
}{
	// interpreters.main follows interpreters.head, and is the same
	// interpreter in a process of one: the field before it (a mutex,
	// next_id in 3.10) is taken for the wrong one.
	{"interpreters.head", func(o *offsets) *int64 { return &o.interpHead }, false},
	{"threads.head", func(o *offsets) *int64 { return &o.interpThreads }, false},
	{"next", func(o *offsets) *int64 { return &o.tsNext }, false},
	{"native_thread_id", func(o *offsets) *int64 { return &o.tsNativeID }, false},
	{"thread_id", func(o *offsets) *int64 { return &o.tsThreadID }, false},
	{"current_frame", func(o *offsets) *int64 { return &o.tsFrame }, false},
	{"cframe", func(o *offsets) *int64 { return &o.tsCFrame }, false},
	{"cframe's current_frame", func(o *offsets) *int64 { return &o.cfCurrent }, false},
	{"previous", func(o *offsets) *int64 { return &o.frPrevious }, false},
	{"f_executable", func(o *offsets) *int64 { return &o.frCode }, false},
	{"instr_ptr", func(o *offsets) *int64 { return &o.frInstr }, false},
	{"owner", func(o *offsets) *int64 { return &o.frOwner }, true},
	{"is_entry", func(o *offsets) *int64 { return &o.frEntry }, true},
	{"co_filename", func(o *offsets) *int64 { return &o.coFilename }, false},
	{"co_name", func(o *offsets) *int64 { return &o.coName }, false},
	{"co_qualname", func(o *offsets) *int64 { return &o.coQualname }, false},
	{"co_firstlineno", func(o *offsets) *int64 { return &o.coFirstLine }, false},
	{"co_linetable", func(o *offsets) *int64 { return &o.coLinetable }, false},
	{"co_code_adaptive", func(o *offsets) *int64 { return &o.coCodeAdaptive }, false},
	{"ob_sval", func(o *offsets) *int64 { return &o.bytesData }, false},
	{"PyASCIIObject.length", func(o *offsets) *int64 { return &o.strLength }, false},
	{"PyASCIIObject.state", func(o *offsets) *int64 { return &o.strState }, true},
	{"sizeof(PyASCIIObject)", func(o *offsets) *int64 { return &o.asciiSize }, false},
	{"thread state interp", func(o *offsets) *int64 { return &o.tsInterp }, false},
	{"_code_object_generation", func(o *offsets) *int64 { return &o.interpCodeGen }, false},
}

// probeInterp is the interpreter file python runs with, as DetectFile
// reads it (its file's own addresses).
func probeInterp(t *testing.T, pt probeTarget) *Interp {
	t.Helper()
	for _, f := range InterpreterFiles(pt.root, pt.python, "") {
		in, err := DetectFile(f)
		if err != nil {
			t.Fatalf("DetectFile %s: %v", f, err)
		}
		if in != nil {
			return in
		}
	}
	t.Fatalf("%s: no interpreter file cudatrace reads", pt.python)
	return nil
}

// probeOut is what layoutprobe.py prints.
type probeOut struct {
	Errors  []string
	Runtime uint64
	Types   struct{ Code, Str, Bytes uint64 }
	Shims   int
	Frames  []struct {
		Code      uint64
		Units     int64
		File      string
		Function  string
		Line      int
		Innermost bool
		Regions   []struct {
			At  uint64
			Hex string
		}
	}
}

// regions serves reads from the bytes the probe read of its objects.
type regions []part

func (r regions) ReadAt(b []byte, addr uint64) error {
	for _, p := range r {
		if rest, ok := p.from(addr); ok && len(rest) >= len(b) {
			copy(b, rest)
			return nil
		}
	}
	return fmt.Errorf("%d bytes at %#x: not read by the probe", len(b), addr)
}

// probeLayout runs the probe under pt's interpreter with the offsets off
// (in's, or some made wrong) and returns what failed.
func probeLayout(t *testing.T, pt probeTarget, in *Interp, off offsets) []string {
	t.Helper()
	script, err := os.ReadFile(filepath.Join("testdata", "layoutprobe.py"))
	if err != nil {
		t.Fatal(err)
	}
	l := map[string]any{"interp_head": off.interpHead, "interp_threads": off.interpThreads, "ts_next": off.tsNext,
		"ts_native_id": off.tsNativeID, "ts_thread_id": off.tsThreadID, "ts_frame": off.tsFrame, "ts_cframe": off.tsCFrame,
		"cf_current": off.cfCurrent, "fr_previous": off.frPrevious, "fr_code": off.frCode, "fr_instr": off.frInstr,
		"fr_owner": off.frOwner, "fr_entry": off.frEntry, "co_code_adaptive": off.coCodeAdaptive,
		"co_filename": off.coFilename, "co_name": off.coName, "co_qualname": off.coQualname,
		"co_firstlineno": off.coFirstLine, "co_linetable": off.coLinetable, "owned_cstack": versions[in.Minor].entryOwner,
		"ts_interp": off.tsInterp, "interp_code_gen": off.interpCodeGen}
	arg, _ := json.Marshal(l)
	argv := []string{pt.python, "-c", string(script), string(arg)}
	if pt.root != "" {
		argv = append([]string{"chroot", pt.root}, argv...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		return []string{fmt.Sprintf("the probe: %v\n%s", err, stderr.String())}
	}
	var out probeOut
	if err := json.Unmarshal(stdout, &out); err != nil {
		return []string{fmt.Sprintf("the probe's output %q: %v", stdout, err)}
	}
	problems := out.Errors
	// The process's addresses are the file's moved by its load bias: the
	// type objects the code reads must be where its symbols say.
	in2 := *in
	in2.off = off
	base := out.Runtime - in.runtime
	in2.runtime += base
	for _, ty := range []struct {
		at   *uint64
		want uint64
		name string
	}{{&in2.types.code, out.Types.Code, "PyCode_Type"}, {&in2.types.str, out.Types.Str, "PyUnicode_Type"},
		{&in2.types.bytes, out.Types.Bytes, "PyBytes_Type"}} {
		if *ty.at != 0 {
			if *ty.at += base; *ty.at != ty.want {
				problems = append(problems, fmt.Sprintf("%s at %#x, the process's at %#x", ty.name, *ty.at, ty.want))
			}
		}
	}
	named := 0
	for _, f := range out.Frames {
		var r regions
		for _, reg := range f.Regions {
			b, err := hex.DecodeString(reg.Hex)
			if err != nil {
				t.Fatal(err)
			}
			r = append(r, part{reg.At, b})
		}
		fr, err := in2.codeFrame(r, f.Code, f.Units)
		want := Frame{f.File, f.Function, f.Line}
		if f.Innermost {
			// The probe's own frame ran on between the two reads: its
			// line is not compared.
			fr.Line, want.Line = 0, 0
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("frame of %s: %v", f.Function, err))
		} else if fr != want {
			problems = append(problems, fmt.Sprintf("frame named %+v, CPython says %+v", fr, want))
		} else {
			named++
		}
	}
	if named < 6 {
		problems = append(problems, fmt.Sprintf("%d frames named, want the probe's 6", named))
	}
	if in.Minor >= 12 && out.Shims < 4 {
		problems = append(problems, fmt.Sprintf("%d entry frames, want 4 (the script's, sorted's, next's, send's)", out.Shims))
	}
	return problems
}
