package vmtest

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// pyRunner runs CPython v: "3.12" is pyenv's, "sid-3.15" Debian sid's in
// the sid root scripts/deps.sh makes (its libc is newer than the host's),
// as a container of its own with that root (testenv.RootScript), /tmp
// bind-mounted into it: a path under /tmp means the same inside and out.
type pyRunner struct {
	v      string
	root   string // "" for pyenv's
	python string // the interpreter, a path inside root
}

func newPyRunner(t *testing.T, v string) *pyRunner {
	t.Helper()
	if sv, ok := strings.CutPrefix(v, "sid-"); ok {
		root, python := sidPython(t, sv)
		return &pyRunner{v: v, root: root, python: python}
	}
	return &pyRunner{v: v, python: pyenvPython(t, v)}
}

// minor is the version without its sid- prefix ("3.15"), as the tests'
// version checks take it.
func (p *pyRunner) minor() string { return strings.TrimPrefix(p.v, "sid-") }

// argv runs python with args (paths under /tmp for sid's).
func (p *pyRunner) argv(args ...string) []string {
	if p.root == "" {
		return append([]string{p.python}, args...)
	}
	return []string{"unshare", "-m", "sh", "-c", testenv.RootScript(p.root, []string{"/tmp"}, append([]string{p.python}, args...)...)}
}

// script is testdata's file name where python can read it: its absolute
// path, or for sid's a copy under /tmp.
func (p *pyRunner) script(t *testing.T, name string) string {
	t.Helper()
	s, _ := filepath.Abs(filepath.Join("testdata", name))
	if p.root != "" {
		s = copyToTemp(t, s)
	}
	return s
}

// base is the interpreter's file name, as the report names the process.
func (p *pyRunner) base() string { return filepath.Base(p.python) }
