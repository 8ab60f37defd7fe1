// Package testenv is what the tests share about the machine they run on.
// A test that needs a tool the machine lacks (gcc, python3, a pyenv
// CPython, root) skips on a developer's machine and fails under CI=true,
// where a skip would hide that it never ran: SkipOrFail is that rule, kept
// in one place.
package testenv

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// InCI reports whether a skip must count as a failure (CI=true, as .ci/run
// sets it).
func InCI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips the test, or fails it under CI=true.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true, so this is a failure, not a skip: "+format, args...)
	}
	t.Skipf(format, args...)
}

// LookPath returns the path of the program name, or skips (fails under
// CI=true) where there is none.
func LookPath(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		SkipOrFail(t, "%s is needed: %v", name, err)
	}
	return path
}

// PyenvRoot is where .ci/run installs the CPython versions the Python
// tests run (pyenv).
const PyenvRoot = "/root/.pyenv/versions"

// Pyenv returns the first file matching pattern under PyenvRoot
// ("3.12.*/bin/python3.12"), or skips (fails under CI=true) where none
// does; what names the file for the message.
func Pyenv(t testing.TB, pattern, what string) string {
	t.Helper()
	found, _ := filepath.Glob(filepath.Join(PyenvRoot, pattern))
	if len(found) == 0 {
		SkipOrFail(t, "no %s under %s", what, PyenvRoot)
	}
	return found[0]
}

// Python returns pyenv's CPython v ("3.12").
func Python(t testing.TB, v string) string {
	t.Helper()
	return Pyenv(t, v+".*/bin/python"+v, "CPython "+v)
}

// LibPython returns pyenv's libpython of CPython v ("3.12").
func LibPython(t testing.TB, v string) string {
	t.Helper()
	return Pyenv(t, v+".*/lib/libpython"+v+".so.1.0", "libpython"+v)
}

// Python3 returns the python3 on PATH that can import modules, or skips
// (fails under CI=true) where there is none: the pickle and memviz tests
// check their files with CPython's own reader.
func Python3(t testing.TB, modules ...string) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err == nil && len(modules) > 0 {
		err = exec.Command(py, "-c", "import "+strings.Join(modules, ", ")).Run()
	}
	if err != nil {
		SkipOrFail(t, "python3 (importing %s) is needed: %v", strings.Join(modules, ", "), err)
	}
	return py
}

// RunPython runs the Python script with args under py and returns its
// stdout; a failure fails the test with the script's stderr.
func RunPython(t testing.TB, py, script string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	return out
}

// Opcodes is what PickleOpcodes finds in pickle files: the opcodes they
// hold outside the allowed set, and those of the set none of them holds.
type Opcodes struct{ Extra, Unused []string }

// PickleOpcodes walks pickle files with CPython's pickletools.genops under
// py. Each must start with PROTO 2, end with STOP at its last byte and hold
// no opcode newer than protocol 2 (the test fails otherwise).
func PickleOpcodes(t testing.TB, py string, allowed []string, paths ...string) Opcodes {
	t.Helper()
	script := `
import json, pickletools, sys
allowed = set(json.loads(sys.argv[1]))
used = set()
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and ops[0][1] == 2, ops[0]
    assert ops[-1][0].name == "STOP" and ops[-1][2] == len(data) - 1, "STOP is not the last byte"
    for op, arg, pos in ops:
        used.add(op.name)
        assert op.proto <= 2, "%s is protocol %d" % (op.name, op.proto)
print(json.dumps({"extra": sorted(used - allowed), "unused": sorted(allowed - used)}))
`
	set, _ := json.Marshal(allowed)
	out := RunPython(t, py, script, append([]string{string(set)}, paths...)...)
	var res Opcodes
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("python output %q: %v", out, err)
	}
	return res
}

// TempFile writes data to a file called name in a directory the test
// removes when it ends, and returns its path.
func TempFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// SidRootDefault is where scripts/deps.sh makes a Debian sid root
// (debootstrap) with the newest CPython, 3.14: its libc is newer than the
// host's, so its programs run chrooted into it. CUDATRACE_SID_ROOT names
// another.
const SidRootDefault = "/var/cache/cudatrace-sid/root"

// SidPython returns the sid root and the path, inside it, of its CPython
// v ("3.14"), or skips (fails under CI=true) where there is none.
func SidPython(t testing.TB, v string) (root, python string) {
	t.Helper()
	root = os.Getenv("CUDATRACE_SID_ROOT")
	if root == "" {
		root = SidRootDefault
	}
	python = "/usr/bin/python" + v
	if _, err := os.Stat(filepath.Join(root, python)); err != nil {
		SkipOrFail(t, "no CPython %s in the sid root %s (scripts/deps.sh makes it): %v", v, root, err)
	}
	return root, python
}

// RootScript is what `unshare -m sh -c` runs to exec command (quoted
// here) with root as its root, as a container runtime does: in its own
// mount namespace, pivot_root-ed into root, the host's tree unmounted.
// Its mappings then name files as its root has them. Each of binds (a
// host directory) is bind-mounted at the same path inside the root: the
// same files (a traced library's uprobes fire in it), under paths that
// mean the same on both sides.
func RootScript(root string, binds []string, command ...string) string {
	q := make([]string, len(command))
	for i, a := range command {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	lines := []string{
		"set -e",
		"mount --make-rprivate /",
		"mount --bind '" + root + "' '" + root + "'",
	}
	for _, b := range binds {
		lines = append(lines, "mkdir -p '"+root+b+"'", "mount --bind '"+b+"' '"+root+b+"'")
	}
	return strings.Join(append(lines,
		"cd '"+root+"'",
		"mount -t proc proc proc", // umount reads /proc/self/mountinfo
		"mkdir -p .old-root",
		"pivot_root . .old-root",
		"umount -l /.old-root",
		"exec "+strings.Join(q, " "),
	), "\n")
}
