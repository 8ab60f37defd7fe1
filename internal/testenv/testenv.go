// Package testenv is what the tests share about the machine they run on.
// A test that needs a tool the machine lacks (gcc, python3, a pyenv
// CPython, root) skips on a developer's machine and fails under CI=true,
// where a skip would hide that it never ran: SkipOrFail is that rule, kept
// in one place.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
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
