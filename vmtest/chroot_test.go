package vmtest

// Processes under chroot(8) in the tracer's own mount namespace: the
// kernel writes their mappings' paths against the tracer's root
// (/srv/root/usr/bin/python3), so their files are found by device and
// inode there, not by prefixing /proc/PID/root to those paths
// (proc.OwnRoot).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/testenv"
)

// chrootRoot is a root to chroot into that runs python (a path inside
// it), with a directory dir inside it (its path inside the root: in) for
// the job's files.
type chrootRoot struct {
	root, python, dir, in string
}

// sidChroot is the sid root scripts/deps.sh makes, with its CPython v.
func sidChroot(t *testing.T, v string) *chrootRoot {
	t.Helper()
	root, python := testenv.SidPython(t, v)
	return newChrootDir(t, root, python)
}

// debianChroot is a root of Debian 12's own /usr (bind-mounted, read-only
// use) with its /usr/bin/python3.11, in a directory of its own: the
// mounts are undone when the test ends.
func debianChroot(t *testing.T) *chrootRoot {
	t.Helper()
	if _, err := os.Stat("/usr/bin/python3.11"); err != nil {
		skipOrFail(t, "needs Debian's /usr/bin/python3.11 (package python3.11): %v", err)
	}
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("/usr", filepath.Join(root, "usr"), "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount /usr: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(filepath.Join(root, "usr"), syscall.MNT_DETACH) })
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if err := os.Symlink("usr/"+l, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	return newChrootDir(t, root, "/usr/bin/python3.11")
}

// newChrootDir makes the job's directory in root, with the stand-in, the
// Python job (pynobody.py) and its 200 call sites (newNobodyWorld's) in it.
func newChrootDir(t *testing.T, root, python string) *chrootRoot {
	t.Helper()
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(tmp, "cudatrace-chroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	w := newNobodyWorld(t)
	for _, f := range []string{w.lib, w.script, w.sites} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &chrootRoot{root: root, python: python, dir: dir, in: strings.TrimPrefix(dir, root)}
}

// argv is the command that runs the job chrooted (pymode hold or exit).
func (c *chrootRoot) argv(pymode string) []string {
	return []string{"chroot", c.root, c.python, filepath.Join(c.in, "pynobody.py"), filepath.Join(c.in, "libcudart.so.12"),
		filepath.Join(c.in, "sites.py"), pymode}
}

// check requires the report of the job (pid) to hold each of its 200
// allocations with its Python lines, as the process named its files.
func (c *chrootRoot) check(t *testing.T, ctx context.Context, trace, stderr string) {
	t.Helper()
	if strings.Contains(stderr, "Python frames left out") || strings.Contains(stderr, "unresolved") {
		t.Errorf("record:\n%s", stderr)
	}
	truths, err := groundTruthFile(filepath.Join(c.dir, "fake.log"), "")
	if err != nil || len(truths) != 1 {
		t.Fatalf("ground truth: %v, %v", truths, err)
	}
	var truth *procTruth
	for _, tr := range truths {
		truth = tr
	}
	rep := runReportArgs(t, ctx, trace, "--top", "500")
	checkProcess(t, rep, truth, 0, filepath.Base(c.python))
	if p := rep.process(truth.PID); p != nil && p.UnresolvedPythonFrames != 0 {
		t.Errorf("%d Python frames unresolved, want 0", p.UnresolvedPythonFrames)
	}
	checkSites(t, rep, truth.PID, filepath.Join(c.in, "sites.py"), filepath.Join(c.in, "pynobody.py"))
}

// TestChrootPython: CPython run under chroot in the tracer's mount
// namespace (the sid root's 3.15 and 3.14, and Debian's 3.11 in a root of its
// own), launched (record -- chroot ...) and attached to (--pid): every
// one of its 200 allocations with its Python lines, none left out.
func TestChrootPython(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "chroot")
	for _, v := range []string{"sid-3.15", "sid-3.14", "3.11"} {
		t.Run(v, func(t *testing.T) {
			var c *chrootRoot
			if sv, ok := strings.CutPrefix(v, "sid-"); ok {
				c = sidChroot(t, sv)
			} else {
				c = debianChroot(t)
			}
			lib := filepath.Join(c.dir, "libcudart.so.12")
			t.Run("launched", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				os.Remove(filepath.Join(c.dir, "fake.log"))
				trace := filepath.Join(c.dir, "launched.trace")
				rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(filepath.Join(c.in, "fake.log")), Stdin: strings.NewReader("go\n")},
					append([]string{"--lib", lib, "-o", trace, "--"}, c.argv("exit")...)...)
				if code := rec.wait(t, 60*time.Second); code != 0 {
					t.Fatalf("record exited %d", code)
				}
				c.check(t, ctx, trace, rec.stderr.String())
			})
			t.Run("pid", func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				os.Remove(filepath.Join(c.dir, "fake.log"))
				argv := c.argv("exit")
				cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
				cmd.Env = fakeEnv(filepath.Join(c.in, "fake.log"))
				job := startCmdJob(t, "pynobody.py", cmd)
				trace := filepath.Join(c.dir, "pid.trace")
				rec := startRecord(t, ctx, recordOpts{}, "--pid", strconv.Itoa(job.pid), "--lib", lib, "-o", trace)
				rec.waitAttached(t, 30*time.Second)
				fmt.Fprintln(job.in, "go")
				if code := rec.wait(t, 60*time.Second); code != 0 {
					t.Fatalf("record exited %d", code)
				}
				c.check(t, ctx, trace, rec.stderr.String())
			})
		})
	}
}
