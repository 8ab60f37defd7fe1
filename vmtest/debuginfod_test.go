package vmtest

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// debuginfodRoot is where scripts/deps.sh unpacks Debian's python3.11
// and python3.11-dbg at one version, away from /usr/lib/debug.
func debuginfodRoot() string { return filepath.Join(kernelCache(), "debuginfod", "root") }

// startDebuginfod runs elfutils' debuginfod on a loopback port over dir's
// debug files and waits until it serves the one with build ID want.
func startDebuginfod(t *testing.T, ctx context.Context, dir, want string) (url string, stop func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.CommandContext(ctx, "debuginfod", "-d", filepath.Join(t.TempDir(), "db.sqlite"), "-p", fmt.Sprint(port), "-F", dir)
	log := newLockedBuffer("")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	stop = func() {
		cmd.Process.Kill()
		<-done
	}
	t.Cleanup(stop)
	url = fmt.Sprintf("http://127.0.0.1:%d", port)
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		resp, err := http.Get(url + "/buildid/" + want + "/debuginfo")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return url, stop
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("debuginfod did not serve build ID %s within 90s:\n%s", want, truncate(log.String(), 4096))
		}
	}
}

// buildIDOf is an ELF file's GNU build ID, in hex.
func buildIDOf(t *testing.T, path string) string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := f.Section(".note.gnu.build-id")
	if s == nil {
		t.Fatalf("%s has no build ID", path)
	}
	b, err := s.Data()
	if err != nil || len(b) < 16 {
		t.Fatalf("%s: build ID note: %v", path, err)
	}
	return fmt.Sprintf("%x", b[16:])
}

// symtabFunc names address pc of an ELF file as gdb's `info symbol` does:
// the function symbol of its full symbol table (here the debug file's)
// that holds it.
func symtabFunc(syms []elf.Symbol, pc uint64) string {
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value <= pc && pc < s.Value+s.Size {
			return s.Name
		}
	}
	return ""
}

// TestDebuginfod: a CPython that is stripped (Debian's python3.11, as
// shipped) records with its interpreter's native frames as addresses
// where its dynamic symbols do not name them; with DEBUGINFOD_URLS naming
// a real debuginfod server (elfutils') that serves python3.11-dbg's debug
// files, report names every one of them as gdb does (the debug file's
// full symbol table), fetched by build ID into the cache elfutils' client
// lays out. With the server down: one line saying so, and the same
// figures.
func TestDebuginfod(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "debuginfod")
	root := debuginfodRoot()
	py := filepath.Join(root, "usr/bin/python3.11")
	debugDir := filepath.Join(root, "usr/lib/debug")
	if _, err := os.Stat(py); err != nil {
		skipOrFail(t, "Debian's python3.11 and python3.11-dbg unpacked by scripts/deps.sh: %v", err)
	}
	id := buildIDOf(t, py)
	debugFile := filepath.Join(debugDir, ".build-id", id[:2], id[2:]+".debug")
	df, err := elf.Open(debugFile)
	if err != nil {
		t.Fatalf("python3.11-dbg has no debug file for python3.11's build ID %s: %v", id, err)
	}
	syms, err := df.Symbols()
	df.Close()
	if err != nil {
		t.Fatal(err)
	}

	script, _ := filepath.Abs(filepath.Join("testdata", "pyexit.py"))
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "py.trace")
	rec := exec.CommandContext(ctx, tracerBin, "record", "--lib", fakeLib, "-o", trace, "--", py, script, fakeLib, "exit")
	rec.Env = append(fakeEnv(log), "PYTHONHOME="+filepath.Join(root, "usr"), "DEBUGINFOD_URLS=")
	if out, err := rec.CombinedOutput(); err != nil {
		t.Fatalf("record: %v\n%s", err, out)
	}
	truth := onlyTruth(t, log, "")

	// report: its frames of python3.11, by stack; the warnings it printed.
	report := func(env ...string) (frames [][]reportFrameAt, stderr string, allocs uint64) {
		t.Helper()
		cmd := exec.CommandContext(ctx, tracerBin, "report", trace, "--json")
		cmd.Env = append(os.Environ(), env...)
		var errb strings.Builder
		cmd.Stderr = &errb
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("report: %v\n%s", err, errb.String())
		}
		var rep struct {
			Processes []struct {
				Allocs uint64 `json:"allocs"`
			} `json:"processes"`
			Stacks []struct {
				Frames []reportFrameAt `json:"frames"`
			} `json:"stacks"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("%v:\n%s", err, truncate(string(out), 4096))
		}
		for _, p := range rep.Processes {
			allocs += p.Allocs
		}
		for _, s := range rep.Stacks {
			var in []reportFrameAt
			for _, f := range s.Frames {
				if filepath.Base(f.Module) == "python3.11" {
					in = append(in, f)
				}
			}
			frames = append(frames, in)
		}
		return frames, errb.String(), allocs
	}

	// Without a server, the stripped interpreter's own functions are
	// addresses (what the test is about); the figures are the truth's.
	without, _, allocs := report("DEBUGINFOD_URLS=")
	if allocs != uint64(truth.Allocs) {
		t.Errorf("%d allocations reported, want %d", allocs, truth.Allocs)
	}
	unnamed := 0
	for _, st := range without {
		for _, f := range st {
			if f.Function == "" {
				unnamed++
			}
		}
	}
	if unnamed == 0 {
		t.Fatalf("no frame of the stripped python3.11 is unnamed without a server: nothing to test (%v)", without)
	}

	url, stop := startDebuginfod(t, ctx, debugDir, id)
	cache := filepath.Join(dir, "cache")
	with, stderr, allocs := report("DEBUGINFOD_URLS="+url, "DEBUGINFOD_CACHE_PATH="+cache)
	if allocs != uint64(truth.Allocs) {
		t.Errorf("with the server: %d allocations reported, want %d", allocs, truth.Allocs)
	}
	n := 0
	for _, st := range with {
		for _, f := range st {
			n++
			want := symtabFunc(syms, f.Offset-1) // the call, one byte before the return address
			if f.Function != want || want == "" {
				t.Errorf("python3.11+%#x named %q, want %q (the debug file's symbol table)", f.Offset, f.Function, want)
			}
		}
	}
	if n == 0 {
		t.Fatal("no python3.11 frame in the report's stacks")
	}
	if _, err := os.Stat(filepath.Join(cache, id, "debuginfo")); err != nil {
		t.Errorf("the debug file is not where elfutils' client caches it: %v", err)
	}
	if stderr != "" {
		t.Errorf("report with the server up said: %s", stderr)
	}

	// The server down: one line, the same figures, the frames as without.
	stop()
	down, stderr, allocs := report("DEBUGINFOD_URLS="+url, "DEBUGINFOD_CACHE_PATH="+filepath.Join(dir, "cache2"))
	if allocs != uint64(truth.Allocs) {
		t.Errorf("with the server down: %d allocations reported, want %d", allocs, truth.Allocs)
	}
	if lines := strings.Count(stderr, "\n"); lines != 1 || !strings.Contains(stderr, url) {
		t.Errorf("with the server down report said %d lines, want one naming %s:\n%s", lines, url, stderr)
	}
	if fmt.Sprint(down) != fmt.Sprint(without) {
		t.Errorf("with the server down the python3.11 frames differ from those without one:\n%v\n%v", down, without)
	}
}

// reportFrameAt is a report frame with its address in its file.
type reportFrameAt struct {
	Function string `json:"function"`
	Module   string `json:"module"`
	Offset   uint64 `json:"offset"`
}
