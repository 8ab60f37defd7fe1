package pystack

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/proc"
)

func markedLine(t *testing.T, tag string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "nested.py"))
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(l, "# LINE:"+tag) {
			return i + 1
		}
	}
	t.Fatalf("no LINE:%s", tag)
	return 0
}

// Every CPython 3.10 to 3.13 under pyenv: the main thread's Python stack,
// read from outside while it blocks in a ctypes call, is the script's
// frames with their exact lines and (qualified, from 3.11) names. From
// 3.11, a second thread's too (3.10 keeps no native thread id: only the
// main thread is found).
func TestStackCPython(t *testing.T) {
	script, _ := filepath.Abs(filepath.Join("testdata", "nested.py"))
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			python := testenv.Python(t, v)
			checkStack(t, python, nil, script, v, false)
			if v != "3.10" {
				checkStack(t, python, nil, script, v, true)
			}
		})
	}
}

// CPython 3.15 and 3.14 (Debian sid's, without DWARF: their _Py_DebugOffsets), run
// as a container of its own in the sid root scripts/deps.sh makes, and sid's newest 3.13
// where the root has one: the same stacks, read through the process's
// own root.
func TestStackSid(t *testing.T) {
	for _, v := range []string{"3.15", "3.14", "3.13"} {
		t.Run(v, func(t *testing.T) {
			if os.Getuid() != 0 {
				testenv.SkipOrFail(t, "chroot needs root")
			}
			root, python := testenv.SidPython(t, v)
			b, err := os.ReadFile(filepath.Join("testdata", "nested.py"))
			if err != nil {
				t.Fatal(err)
			}
			dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "pystack")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			script := filepath.Join(dir, "nested.py")
			if err := os.WriteFile(script, b, 0o644); err != nil {
				t.Fatal(err)
			}
			inRoot := strings.TrimPrefix(script, root)
			checkStackIn(t, root, python, nil, inRoot, v, false)
			checkStackIn(t, root, python, nil, inRoot, v, true)
		})
	}
}

// The same on 3.10 to 3.12 builds without DWARF: pyenv's, their libpython
// stripped of its debug information, read with the built-in offsets.
// Debian 12's own python3.11 (3.11.2, static, no DWARF) too, where it is
// installed (.ci/run installs it).
func TestStackWithoutDWARF(t *testing.T) {
	script, _ := filepath.Abs(filepath.Join("testdata", "nested.py"))
	for _, v := range []string{"3.10", "3.11", "3.12"} {
		t.Run(v, func(t *testing.T) {
			python := testenv.Python(t, v)
			env := []string{"LD_LIBRARY_PATH=" + strippedLib(t, v)}
			in := checkStack(t, python, env, script, v, false)
			if !strings.HasPrefix(in.Path, os.TempDir()) {
				t.Fatalf("read %s, not the stripped copy", in.Path)
			}
			if v != "3.10" {
				checkStack(t, python, env, script, v, true)
			}
		})
	}
	t.Run("debian-3.11", func(t *testing.T) {
		const python = "/usr/bin/python3.11"
		if _, err := os.Stat(python); err != nil {
			testenv.SkipOrFail(t, "%v", err)
		}
		f, err := elf.Open(python)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if f.Section(".debug_info") != nil {
			t.Fatalf("%s has DWARF: it would not test the table", python)
		}
		syms, _ := f.DynamicSymbols()
		if v := buildVersion(f, syms, 11); !regexp.MustCompile(`^3\.11\.\d+$`).MatchString(v) {
			t.Errorf("%s: version %q, want a 3.11 release", python, v)
		}
		checkStack(t, python, nil, script, "3.11", false)
		checkStack(t, python, nil, script, "3.11", true)
	})
}

func checkStack(t *testing.T, python string, env []string, script, v string, thread bool) *Interp {
	t.Helper()
	return checkStackIn(t, "", python, env, script, v, thread)
}

// checkStackIn is checkStack for a python run in a container of its own
// with root as its root ("" for none): python and script are paths
// inside it.
func checkStackIn(t *testing.T, root, python string, env []string, script, v string, thread bool) *Interp {
	t.Helper()
	args := []string{script}
	if thread {
		args = append(args, "thread")
	}
	cmd := exec.Command(python, args...)
	if root != "" {
		cmd = exec.Command("unshare", "-m", "sh", "-c", testenv.RootScript(root, nil, append([]string{python}, args...)...))
	}
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := cmd.Process.Pid
	tid := 0
	if l, err := bufio.NewReader(out).ReadString('\n'); err != nil || !strings.HasPrefix(l, "ready ") {
		t.Fatalf("script said %q, %v", l, err)
	} else if tid, err = strconv.Atoi(strings.TrimSpace(l[6:])); err != nil {
		t.Fatal(err)
	}
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	procRoot := ""
	if root != "" {
		procRoot = proc.RootPath(pid, "/")
	}
	in, err := Detect(procRoot, maps)
	if err != nil || in == nil {
		t.Fatalf("Detect: %v, %v", in, err)
	}
	if want := int(v[3] - '0' + 10); in.Minor != want {
		t.Fatalf("detected 3.%d", in.Minor)
	}
	if root == "" {
		checkDetectInRoot(t, maps, in)
	}
	// The interpreter loop lies in the interpreter's executable mapping,
	// where BPF stacks' return addresses into it will be.
	if len(in.Eval) == 0 {
		t.Fatalf("no _PyEval_EvalFrameDefault in %s", in.Path)
	}
	for _, r := range in.Eval {
		inside := false
		for _, m := range maps {
			if m.Path == in.Path && m.Exec() && r[0] >= m.Start && r[1] <= m.End && r[0] < r[1] {
				inside = true
			}
		}
		if !inside {
			t.Errorf("_PyEval_EvalFrameDefault at %#x-%#x: in no executable mapping of %s", r[0], r[1], in.Path)
		}
	}
	// 3.11 alone marks entry frames with is_entry.
	if l, err := in.BPF(); err != nil || (l.FrEntry >= 0) != (in.Minor == 11) || l.Minor != uint16(in.Minor) || (l.FrOwner >= 0) != (in.Minor >= 12) {
		t.Errorf("layout %+v for 3.%d: %v", l, in.Minor, err)
	}
	method := "method"
	if in.Minor >= 11 {
		method = "Outer.method"
	}
	frames := []Frame{
		{script, "leaf", markedLine(t, "leaf")},
		{script, "middle", markedLine(t, "middle")},
		{script, method, markedLine(t, "method")},
		{script, "<module>", markedLine(t, "module")},
	}
	if thread {
		// The thread runs Outer.method from threading's bootstrap.
		frames = append(frames[:3:3], Frame{"threading.py", "Thread.run", 0},
			Frame{"threading.py", "Thread._bootstrap_inner", 0}, Frame{"threading.py", "Thread._bootstrap", 0})
		if tid == pid {
			t.Fatalf("the thread is the main thread")
		}
	}
	want := fmt.Sprint(frames)
	// The thread reaches pause() just after it said "ready".
	var got string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		st, err := in.Stack(pid, tid)
		if err != nil {
			t.Fatalf("Stack: %v", err)
		}
		if thread {
			// threading.py's lines differ by version: its frames
			// are checked by file name and function.
			for i := range st {
				if i >= 3 && filepath.Base(st[i].File) == "threading.py" {
					st[i].File, st[i].Line = "threading.py", 0
				}
			}
		}
		if got = fmt.Sprint(st); got == want {
			break
		}
	}
	if got != want {
		t.Fatalf("stack\n got %s\nwant %s", got, want)
	}
	if thread {
		// Meanwhile the main thread waits in join, once Thread.start
		// has returned: the thread may say "ready" before it does.
		joined := Frame{script, "<module>", markedLine(t, "join")}
		var st []Frame
		var err error
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			st, err = in.Stack(pid, pid)
			if err != nil || len(st) > 0 && st[len(st)-1] == joined || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || len(st) == 0 || st[len(st)-1] != joined {
			t.Errorf("main thread: %v, %v; want <module> at line %d last", st, err, markedLine(t, "join"))
		}
	}
	// A thread the interpreter does not know has no Python stack.
	if st, err := in.Stack(pid, pid+1<<20); err != nil || st != nil {
		t.Errorf("unknown thread: %v, %v", st, err)
	}
	checkRawStack(t, in, pid, tid, want, thread)
	return in
}

// checkRawStack: the frames as the walk in BPF records them resolve to
// the stack Stack reads (want, threading.py's lines left out), innermost
// first, cut at max; the outermost frame of a run entered from C is an
// entry (3.10: every frame) and the innermost, called from Python, is not.
func checkRawStack(t *testing.T, in *Interp, pid, tid int, want string, thread bool) {
	t.Helper()
	raw, known, err := in.RawStack(pid, tid, 32)
	if err != nil || !known {
		t.Fatalf("RawStack: %v, known %v", err, known)
	}
	var st []Frame
	for _, r := range raw {
		fr, err := in.Code(pid, r.Code, int64(r.Units))
		if err != nil {
			t.Fatal(err)
		}
		// Named from a capture as BPF takes it, the same frame; from one
		// whose line table was cut short of the instruction, none: the
		// caller reads the process then (record/python.go).
		ci, err := in.Parse(in.captureOf(pid, r.Code, 4096))
		if err != nil {
			t.Fatalf("Parse of a capture of %#x: %v", r.Code, err)
		}
		if got, err := ci.Frame(int64(r.Units)); err != nil || got != fr {
			t.Errorf("named from its capture: %+v, %v; from the process: %+v", got, err, fr)
		}
		// The cut capture's other parts may hold the table's bytes anyway
		// (a small table allocated right after the code's name lies in
		// the name's 256 bytes): then the frame is named right, never
		// wrong; where no other part holds them, it is not named.
		c := in.captureOf(pid, r.Code, int(in.off.bytesData))
		data := c.Table + uint64(in.off.bytesData)
		others := captured{&events.PyCodeCapture{Code: c.Code, Head: c.Head, File: c.File, FileBytes: c.FileBytes, Name: c.Name, NameBytes: c.NameBytes}}
		if cut, err := in.Parse(c); err != nil {
			t.Errorf("Parse of a capture without its line table's bytes: %v", err)
		} else if got, err := cut.Frame(int64(r.Units)); others.after(data) == 0 && !errors.Is(err, ErrNotCaptured) {
			t.Errorf("a capture without its line table's bytes named %+v, %v; want ErrNotCaptured", got, err)
		} else if err == nil && got != fr {
			t.Errorf("a capture whose line table's bytes lie in its other parts named %+v; from the process: %+v", got, fr)
		} else if err != nil && !errors.Is(err, ErrNotCaptured) {
			t.Errorf("a cut capture: %v; want the frame or ErrNotCaptured", err)
		}
		if thread && len(st) >= 3 && filepath.Base(fr.File) == "threading.py" {
			fr.File, fr.Line = "threading.py", 0
		}
		st = append(st, fr)
	}
	if got := fmt.Sprint(st); got != want {
		t.Fatalf("raw stack\n got %s\nwant %s", got, want)
	}
	if last := raw[len(raw)-1]; !last.Entry || raw[0].Entry != (in.Minor == 10) {
		t.Errorf("3.%d raw stack %+v: want the outermost an entry, the innermost one only on 3.10", in.Minor, raw)
	}
	if cut, _, err := in.RawStack(pid, tid, 2); err != nil || len(cut) != 2 || cut[0] != raw[0] || cut[1] != raw[1] {
		t.Errorf("RawStack cut at 2: %+v, %v; want %+v", cut, err, raw[:2])
	}
	// A thread the interpreter does not know: known (no Python) from
	// 3.11 on, where threads are found by native id; 3.10 cannot tell.
	if raw, known, err := in.RawStack(pid, pid+1<<20, 32); err != nil || raw != nil || known != (in.Minor != 10) {
		t.Errorf("unknown thread: %v, known %v, %v", raw, known, err)
	}
}

// 3.13's own description of its layout (_Py_DebugOffsets) says what its
// DWARF says, for every offset the walks use; earlier versions have none.
func TestDebugOffsets(t *testing.T) {
	for _, v := range []string{"3.12", "3.13"} {
		lib := testenv.LibPython(t, v)
		f, err := elf.Open(lib)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var runtime uint64
		syms, _ := f.DynamicSymbols()
		for _, s := range syms {
			if s.Name == "_PyRuntime" {
				runtime = s.Value
			}
		}
		minor := int(v[3]-'0') + 10
		deb, _, ok := debugOffsets(f, runtime, minor)
		if v == "3.12" {
			if ok {
				t.Errorf("%s: _Py_DebugOffsets read from a 3.12 build", lib)
			}
			continue
		}
		if !ok {
			t.Fatalf("%s: no _Py_DebugOffsets", lib)
		}
		d, err := f.DWARF()
		if err != nil {
			t.Fatal(err)
		}
		dw, err := dwarfOffsets(d, minor)
		if err != nil {
			t.Fatal(err)
		}
		dw.mainThread = -1 // 3.13 finds threads by native id: the debug offsets leave it out
		if deb != dw {
			t.Fatalf("%s:\n_Py_DebugOffsets %+v\nDWARF            %+v", lib, deb, dw)
		}
	}
}

func TestLineTables(t *testing.T) {
	// 3.10: (2 bytes, +1), (4 bytes, no line), (2 bytes, +2).
	t310 := []byte{2, 1, 4, 0x80, 2, 2}
	for off, want := range map[int64]int{0: 11, 1: 11, 2: 0, 5: 0, 6: 13, 8: 0} {
		if got, found := line310(t310, 10, off); got != want || found != (off < 8) {
			t.Errorf("line310 at %d: %d, %v; want %d, %v", off, got, found, want, off < 8)
		}
	}
	// 3.11+: no-column entry (code 13) +3 over 2 units; one-line form
	// (code 11: +1) over 1 unit; no location (15) over 1 unit; long form
	// (14) -2 over 3 units.
	t311 := []byte{0x80 | 13<<3 | 1, 6, 0x80 | 11<<3, 1, 2, 0x80 | 15<<3, 0x80 | 14<<3 | 2, 5, 0, 1, 2}
	for off, want := range map[int64]int{0: 23, 1: 23, 2: 24, 3: 0, 4: 22, 6: 22, 7: 0} {
		if got, found := line311(t311, 20, off); got != want || found != (off < 7) {
			t.Errorf("line311 at %d: %d, %v; want %d, %v", off, got, found, want, off < 7)
		}
	}
}

// checkDetectInRoot: a container's interpreter, mapped at a path only its
// root holds, is read from under that root and keeps the path the process
// sees.
func checkDetectInRoot(t *testing.T, maps []proc.Mapping, host *Interp) {
	t.Helper()
	root := t.TempDir()
	moved := append([]proc.Mapping(nil), maps...)
	for i := range moved {
		if !moved[i].File() {
			continue
		}
		orig := moved[i].Path
		moved[i].Path = "/ctr" + orig
		if err := os.MkdirAll(filepath.Dir(root+moved[i].Path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(orig, root+moved[i].Path); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	in, err := Detect(root, moved)
	if err != nil || in == nil {
		t.Fatalf("Detect under %s: %v, %v", root, in, err)
	}
	if in.Path != "/ctr"+host.Path || in.Minor != host.Minor || fmt.Sprint(in.Eval) != fmt.Sprint(host.Eval) {
		t.Errorf("Detect under a root: path %s, 3.%d, eval %v; want %s, 3.%d, %v",
			in.Path, in.Minor, in.Eval, "/ctr"+host.Path, host.Minor, host.Eval)
	}
	if _, err := Detect("", moved); err == nil {
		t.Errorf("Detect without the root found %s: it must not read the host's path", "/ctr"+host.Path)
	}
}

// The interpreter loop's functions, by name: a tail-calling 3.14 build's
// handlers are part of it, the functions around it are not.
func TestInterpreterLoop(t *testing.T) {
	for name, want := range map[string]bool{
		"_PyEval_EvalFrameDefault":              true,
		"_PyEval_EvalFrameDefault.cold":         true,
		"_TAIL_CALL_CALL_BUILTIN_FAST":          true,
		"_TAIL_CALL_start_frame":                true,
		"_TAIL_CALL_CALL_NON_PY_GENERAL.cold":   true,
		"_PyEval_EvalFrame":                     false,
		"_PyEval_Vector":                        false,
		"PyEval_EvalCode":                       false,
		"_PyObject_VectorcallTstate.lto_priv.0": false,
	} {
		if got := interpreterLoop(name); got != want {
			t.Errorf("interpreterLoop(%q) = %v, want %v", name, got, want)
		}
	}
}

// IsReadName tells the interpreters whose frames are read by name alone.
func TestIsReadName(t *testing.T) {
	for path, want := range map[string]bool{
		"/usr/bin/python3.13":                  true,
		"/usr/lib/libpython3.12.so.1.0":        true,
		"python3.10":                           true,
		"/usr/bin/python3.13t":                 false, // free-threaded
		"/usr/bin/python3.9":                   false, // older than read
		"/usr/lib/x86_64-linux-gnu/libc.so.6":  false,
		"/usr/bin/python3":                     false, // which 3.X cannot be told
		"/usr/lib/python3.13/lib-dynload/x.so": false,
		"/usr/bin/python3.13-config":           false,
	} {
		if got := IsReadName(path); got != want {
			t.Errorf("IsReadName(%q) = %v, want %v", path, got, want)
		}
	}
}
