package vmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// startPyJob runs a Python script of testdata (pyagent.py, pyattach.py)
// that loads the stand-in, says "ready" and reads its steps from stdin.
func startPyJob(t *testing.T, ctx context.Context, python, script, log string) *job {
	t.Helper()
	cmd := exec.CommandContext(ctx, python, script, fakeLib)
	cmd.Env = fakeEnv(log)
	return startCmdJob(t, filepath.Base(script), cmd)
}

// TestAgentPython: CPython 3.10 to 3.13 jobs allocate through ctypes from
// two Python functions under the agent. Its live views show the Python
// lines report shows: the profile has each function with its exact
// file:line as a sample of its own with the exact bytes, the memory
// snapshot's segments carry them as memory_viz's frames, and the OOM
// black box names the line of the failing call; a trace window replays
// with them.
func TestAgentPython(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	script, _ := filepath.Abs(filepath.Join("testdata", "pyagent.py"))
	dir := t.TempDir()
	dumps := filepath.Join(dir, "oom")
	ag := startAgent(t, ctx, "--dump-dir", dumps)
	frame := func(fn, tag string) string {
		return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyagent.py", tag), fn)
	}
	// Innermost first, as pprof and the report list frames.
	weights := []string{frame("cuda_malloc", "malloc"), frame("load_weights", "weights"), frame("<module>", "loop")}
	acts := []string{frame("cuda_malloc", "malloc"), frame("alloc_activations", "activations"), frame("<module>", "loop")}
	grow := []string{frame("cuda_malloc", "malloc"), frame("grow", "grow"), frame("<module>", "loop")}
	// The first allocation too: the interpreters installed here are
	// known to BPF before the agent says it attached, and BPF walks a
	// process's frames from its first record (nothing is stopped).
	warmup := []string{frame("cuda_malloc", "malloc"), frame("<module>", "warmup")}
	const wBytes, aBytes = 3 << 20, 5 << 20

	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		t.Run(v, func(t *testing.T) {
			python := pyenvPython(t, v)
			log := filepath.Join(dir, v+".log")
			j := startPyJob(t, ctx, python, script, log)
			pid := strconv.Itoa(j.pid)
			// The agent learns the job runs CPython from its first record
			// (the warm-up, made before "ready"): wait until it has read it.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
				if n, _ := metric(t, m, "cudatrace_allocations_total", "pid", pid, "level", "segment"); n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the agent did not count pid %s's warm-up allocation within 10s", pid)
				}
			}
			j.do(t, "ok", "weights %d", wBytes)
			j.do(t, "ok", "activations %d", aBytes)
			j.do(t, "ok", "weights %d", wBytes)
			j.do(t, "error 2", "grow %d", 2*fakeMemLimit) // cudaErrorMemoryAllocation

			truth := onlyTruth(t, log, "")
			if truth.PID != j.pid || truth.Allocs != 4 || truth.Failed != 1 || truth.AllocBytes != 1<<20+2*wBytes+aBytes {
				t.Fatalf("ground truth %+v", truth)
			}

			// The job's answer comes before the agent's reader has the
			// records (under load, by some time): wait until it counted all 4.
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
				if n, _ := metric(t, m, "cudatrace_allocations_total", "pid", pid, "level", "segment"); n == 4 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the agent did not count pid %s's 4 allocations within 10s", pid)
				}
			}
			t.Run("pprof", func(t *testing.T) {
				p := fetchProfile(t, ctx, fmt.Sprintf("%s/debug/pprof/cuda_memory?pid=%s", ag.url, pid))
				got := map[string][]int64{}
				for _, s := range p.Sample {
					k := strings.Join(pythonLocations(s, script), "\n")
					if _, dup := got[k]; dup {
						t.Errorf("two samples with Python frames %q", k)
					}
					got[k] = s.Value
				}
				// GPU memory's four values, then the tensor and host groups, 0.
				zero := make([]int64, 8)
				want := map[string][]int64{
					strings.Join(weights, "\n"): append([]int64{2, 2 * wBytes, 2, 2 * wBytes}, zero...),
					strings.Join(acts, "\n"):    append([]int64{1, aBytes, 1, aBytes}, zero...),
					strings.Join(warmup, "\n"):  append([]int64{1, 1 << 20, 1, 1 << 20}, zero...),
				}
				if len(got) != len(want) {
					t.Errorf("%d samples, want %d: %v", len(got), len(want), got)
				}
				for k, w := range want {
					if !slices.Equal(got[k], w) {
						t.Errorf("sample with Python frames\n%s\n= %v, want %v (all: %v)", k, got[k], w, got)
					}
				}
			})

			t.Run("snapshot", func(t *testing.T) {
				body := get(t, ctx, fmt.Sprintf("%s/snapshot?pid=%s", ag.url, pid), http.StatusOK)
				py, err := exec.LookPath("python3")
				if err != nil {
					skipOrFail(t, "python3 is needed to read the snapshot back: %v", err)
					return
				}
				cmd := exec.CommandContext(ctx, py, "-c", `import pickle, sys
d = pickle.load(sys.stdin.buffer)
for s in d["segments"]:
    fr = ["%s:%d:%s" % (f["filename"], f["line"], f["name"]) for f in s["frames"] if f["filename"] == sys.argv[1]]
    print(s["total_size"], " ".join(fr))`, script)
				cmd.Stdin = bytes.NewReader(body)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("pickle.load: %v\n%s", err, out)
				}
				got := strings.Split(strings.TrimSpace(string(out)), "\n")
				want := []string{fmt.Sprintf("%d %s", 1<<20, strings.Join(warmup, " ")),
					fmt.Sprintf("%d %s", wBytes, strings.Join(weights, " ")),
					fmt.Sprintf("%d %s", wBytes, strings.Join(weights, " ")),
					fmt.Sprintf("%d %s", aBytes, strings.Join(acts, " "))}
				for i := range got {
					got[i] = strings.TrimRight(got[i], " ")
				}
				for i := range want {
					want[i] = strings.TrimRight(want[i], " ")
				}
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("snapshot segments:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			})

			t.Run("oom dump", func(t *testing.T) {
				var files []string
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
					files, _ = filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-%s-*.json", pid)))
					if len(files) == 1 || time.Now().After(deadline) {
						break
					}
				}
				if len(files) != 1 {
					t.Fatalf("OOM reports of pid %s: %v, want one", pid, files)
				}
				data, err := os.ReadFile(files[0])
				if err != nil {
					t.Fatal(err)
				}
				var rep struct {
					Failure struct {
						Size       uint64        `json:"size"`
						Error      string        `json:"error"`
						Frames     []reportFrame `json:"frames"`
						LiveStacks []struct {
							LiveBytes uint64        `json:"live_bytes"`
							Frames    []reportFrame `json:"frames"`
						} `json:"live_stacks"`
					} `json:"failure"`
				}
				if err := json.Unmarshal(data, &rep); err != nil {
					t.Fatalf("%s: %v", files[0], err)
				}
				fl := rep.Failure
				if fl.Size != 2*fakeMemLimit || fl.Error != "cudaErrorMemoryAllocation" {
					t.Errorf("failure %+v", fl)
				}
				if got := pyFrameNames(fl.Frames); !slices.Equal(got, grow) {
					t.Errorf("failing call's Python frames:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(grow, "\n"))
				}
				// The live set by stack, most bytes first, Python lines and all.
				var live []string
				for _, s := range fl.LiveStacks {
					live = append(live, fmt.Sprintf("%d %s", s.LiveBytes, strings.Join(pyFrameNames(s.Frames), " ")))
				}
				wantLive := []string{fmt.Sprintf("%d %s", 2*wBytes, strings.Join(weights, " ")),
					fmt.Sprintf("%d %s", aBytes, strings.Join(acts, " ")), fmt.Sprintf("%d %s", 1<<20, strings.Join(warmup, " "))}
				if strings.Join(live, "\n") != strings.Join(wantLive, "\n") {
					t.Errorf("OOM report's live stacks:\n%s\nwant:\n%s", strings.Join(live, "\n"), strings.Join(wantLive, "\n"))
				}
			})
			t.Run("trace window", func(t *testing.T) {
				trace := filepath.Join(dir, v+".trace")
				traceWindow(t, ag.url, j.pid, 2, trace, func() {
					j.do(t, "ok", "activations %d", 4096)
					j.do(t, "ok", "weights %d", 8192)
				})
				rep := runReport(t, ctx, trace)
				var stacks []string
				for _, s := range rep.Stacks {
					stacks = append(stacks, fmt.Sprintf("%d %s", s.AllocBytes, strings.Join(pyFrameNames(s.Frames), " ")))
				}
				slices.Sort(stacks)
				want := []string{"4096 " + strings.Join(acts, " "), "8192 " + strings.Join(weights, " ")}
				if !slices.Equal(stacks, want) {
					t.Errorf("the window's stacks:\n%s\nwant:\n%s", strings.Join(stacks, "\n"), strings.Join(want, "\n"))
				}
				checkMemvizExport(t, ctx, trace, j.pid)
			})
			j.in.Close()
			if err := j.cmd.Wait(); err != nil {
				t.Errorf("pyagent %d: %v", j.pid, err)
			}
		})
	}
	ag.stop(t)
}

// pythonLocations lists a pprof sample's frames in script, innermost
// first, as file:line:function.
func pythonLocations(s *profile.Sample, script string) []string {
	var out []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil && l.Function.Filename == script {
				out = append(out, fmt.Sprintf("%s:%d:%s", l.Function.Filename, l.Line, l.Function.Name))
			}
		}
	}
	return out
}

// pyFrameNames lists a report stack's Python frames as file:line:function.
func pyFrameNames(fs []reportFrame) []string {
	var out []string
	for _, f := range fs {
		if f.Module == "[python]" {
			out = append(out, fmt.Sprintf("%s:%d:%s", f.File, f.Line, f.Function))
		}
	}
	return out
}

// TestTopPython: top in a tmux pane shows a CPython job's top stacks with
// their Python lines, the allocations of two Python functions as two
// stacks with their own bytes.
func TestTopPython(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "tmux")
	python := pyenvPython(t, "3.12")
	script, _ := filepath.Abs(filepath.Join("testdata", "pyagent.py"))
	j := startPyJob(t, ctx, python, script, filepath.Join(dir, "fake.log"))

	x := &tmux{t: t, sock: fmt.Sprintf("cudatrace-vmtest-py-%d", os.Getpid())}
	t.Cleanup(func() { exec.Command("tmux", "-L", x.sock, "kill-server").Run() })
	cmd := fmt.Sprintf("%s top --pid %d --lib %s --interval 200ms; exec sleep 600", tracerBin, j.pid, fakeLib)
	x.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "150", "sh", "-c", cmd)
	x.waitPane("the header", func(p string) bool {
		return strings.Contains(p, fmt.Sprintf("cudatrace top: pid %d, every 200ms", j.pid))
	}, 30*time.Second)
	// top --pid looks at the job when it starts: its first record, too,
	// carries its Python frames, so it joins the later load_weights stack.
	j.do(t, "ok", "weights %d", 4096)
	x.waitPane("the first allocation", func(p string) bool {
		return strings.Contains(p, fmt.Sprintf("pid %d (python3.12): 4.0 KiB of GPU memory live in 1 allocations", j.pid))
	}, 20*time.Second)
	j.do(t, "ok", "activations %d", 5<<20)
	j.do(t, "ok", "weights %d", 3<<20)
	pane := x.waitPane("both stacks", func(p string) bool { return strings.Contains(p, "[2] 3.0 MiB live in 2 allocations") },
		20*time.Second)
	// Each stack's lines, up to the next stack's header.
	head := regexp.MustCompile(`^(\d)\] ([^\n]*)\n`)
	frameRE := func(fn, tag string) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`#\d+ %s \(pyagent\.py:%d\) \[python\]`, regexp.QuoteMeta(fn), pyLine(t, "pyagent.py", tag)))
	}
	want := map[string]struct {
		head string
		fn   string
		tag  string
	}{
		"1": {"5.0 MiB live in 1 allocation", "alloc_activations", "activations"},
		"2": {"3.0 MiB live in 2 allocations", "load_weights", "weights"},
	}
	seen := 0
	for _, chunk := range strings.Split(pane, "\n[")[1:] {
		m := head.FindStringSubmatch(chunk)
		if m == nil {
			continue
		}
		w, ok := want[m[1]]
		if !ok {
			continue
		}
		seen++
		body := chunk[len(m[0]):]
		if m[2] != w.head || !frameRE(w.fn, w.tag).MatchString(body) || !frameRE("cuda_malloc", "malloc").MatchString(body) ||
			!frameRE("<module>", "loop").MatchString(body) || strings.Contains(body, "_PyEval_EvalFrameDefault") {
			t.Errorf("stack [%s] %q, want %q through %s at pyagent.py:%d, no interpreter loop:\n%s", m[1], m[2], w.head, w.fn,
				pyLine(t, "pyagent.py", w.tag), body)
		}
	}
	if seen != 2 || strings.Contains(pane, "\n[3]") {
		t.Errorf("%d of the two Python stacks found in the pane:\n%s", seen, pane)
	}
	if t.Failed() {
		return
	}
	t.Logf("top's pane:\n%s", pane)
}

// TestAgentPythonFirstBurst: CPython 3.10 to 3.13 (pyenv's), and Debian
// sid's 3.14 and 3.15 in a root of their own (pivot_root), jobs whose first
// allocations, a burst of 20 as they start, end in an OOM and an exit,
// under the agent. BPF walks a process's frames and captures its code
// objects from its first record, stopping nothing: the OOM black box names
// the failing Python line and holds the burst with its exact Python
// frames, not the interpreter loop's native ones.
func TestAgentPythonFirstBurst(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	dumps := filepath.Join(dir, "oom")
	ag := startAgent(t, ctx, "--dump-dir", dumps)
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13", "sid-3.14", "sid-3.15"} {
		t.Run(v, func(t *testing.T) {
			py := newPyRunner(t, v)
			script := py.script(t, "pyburst.py")
			frame := func(fn, tag string) string {
				return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyburst.py", tag), fn)
			}
			burst := []string{frame("load", "load"), frame("<module>", "burst")}
			oom := []string{frame("load", "load"), frame("<module>", "oom")}
			log := filepath.Join(dir, v+".log")
			argv := py.argv(script, fakeLib, strconv.Itoa(2*fakeMemLimit))
			py.warm(t, ctx)
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Env = fakeEnv(log)
			j := startCmdJob(t, "pyburst.py", cmd)
			if err := j.cmd.Wait(); err != nil {
				t.Fatalf("pyburst.py: %v", err)
			}
			truth := onlyTruth(t, log, "")
			if truth.PID != j.pid || truth.Allocs != 20 || truth.Failed != 1 {
				t.Fatalf("ground truth %+v", truth)
			}
			var files []string
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				files, _ = filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-%d-*.json", j.pid)))
				if len(files) == 1 || time.Now().After(deadline) {
					break
				}
			}
			if len(files) != 1 {
				t.Fatalf("OOM reports of pid %d: %v, want one", j.pid, files)
			}
			data, err := os.ReadFile(files[0])
			if err != nil {
				t.Fatal(err)
			}
			var rep struct {
				Failure struct {
					Frames     []reportFrame `json:"frames"`
					LiveStacks []struct {
						LiveBytes uint64        `json:"live_bytes"`
						Frames    []reportFrame `json:"frames"`
					} `json:"live_stacks"`
				} `json:"failure"`
			}
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatalf("%s: %v", files[0], err)
			}
			if got := pyFrameNames(rep.Failure.Frames); !slices.Equal(got, oom) {
				t.Errorf("failing call's Python frames:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(oom, "\n"))
			}
			// By Python frames: from 3.14 the first call of load runs
			// through other native frames than the next (the call
			// specialized after it), a live stack of its own.
			byPy := map[string]uint64{}
			for _, s := range rep.Failure.LiveStacks {
				byPy[strings.Join(pyFrameNames(s.Frames), " ")] += s.LiveBytes
			}
			var live []string
			for _, py := range slices.Sorted(maps.Keys(byPy)) {
				live = append(live, fmt.Sprintf("%d %s", byPy[py], py))
			}
			if want := []string{fmt.Sprintf("%d %s", 20<<20, strings.Join(burst, " "))}; !slices.Equal(live, want) {
				t.Errorf("OOM report's live stacks:\n%s\nwant:\n%s", strings.Join(live, "\n"), strings.Join(want, "\n"))
			}
		})
	}
	ag.stop(t)
}

// TestAgentBesideRecord: an agent and a `record` of a launched command on
// the same library, both tracing the same CPython processes (pyexit.py run
// 10 times, exiting at once, with os._exit and a normal exit), each with
// its own captures of their code objects: record's frames are all exact or
// counted unresolved, and the agent stops within 20 s of SIGTERM.
func TestAgentBesideRecord(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ag := startAgent(t, ctx)
	script, _ := filepath.Abs(filepath.Join("testdata", "pyexit.py"))
	python := pyenvPython(t, "3.12")
	at := func(tag, fn string) string {
		return fmt.Sprintf("%s:%d:%s", script, pyLine(t, "pyexit.py", tag), fn)
	}
	valid := [][]string{
		{at("alloc", "alloc"), at("loop", "<module>")},
		{at("module", "<module>")},
	}
	for _, end := range []string{"_exit", "exit"} {
		exact, unresolved := checkExitRuns(t, []string{python, script, fakeLib, end}, end, valid)
		t.Logf("%s: %d Python frames exact, %d unresolved in 10 runs", end, exact, unresolved)
	}
	ag.stop(t)
}

// TestTopPythonFirstBurst: top (all processes) gives a CPython job's very
// first allocation, made as the job starts, its Python frames: top holds
// a process at its first record until it has read them, as record does.
func TestTopPythonFirstBurst(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "tmux")
	python := pyenvPython(t, "3.12")
	script, _ := filepath.Abs(filepath.Join("testdata", "pyagent.py"))

	x := &tmux{t: t, sock: fmt.Sprintf("cudatrace-vmtest-pyburst-%d", os.Getpid())}
	t.Cleanup(func() { exec.Command("tmux", "-L", x.sock, "kill-server").Run() })
	cmd := fmt.Sprintf("%s top --lib %s --interval 200ms; exec sleep 600", tracerBin, fakeLib)
	x.run("new-session", "-d", "-s", "top", "-x", "200", "-y", "150", "sh", "-c", cmd)
	x.waitPane("the header", func(p string) bool { return strings.Contains(p, "cudatrace top: all processes") }, 30*time.Second)
	time.Sleep(time.Second) // attached: the header comes first
	j := startPyJob(t, ctx, python, script, filepath.Join(dir, "fake.log"))
	frameRE := func(fn, tag string) *regexp.Regexp {
		return regexp.MustCompile(fmt.Sprintf(`#\d+ %s \(pyagent\.py:%d\) \[python\]`, regexp.QuoteMeta(fn), pyLine(t, "pyagent.py", tag)))
	}
	pane := x.waitPane("the warm-up's Python frames", func(p string) bool {
		return frameRE("<module>", "warmup").MatchString(p)
	}, 20*time.Second)
	if !frameRE("cuda_malloc", "malloc").MatchString(pane) || !strings.Contains(pane, fmt.Sprintf("pid %d (python3.12)", j.pid)) {
		t.Errorf("the warm-up's stack lacks cuda_malloc at pyagent.py:%d or pid %d:\n%s", pyLine(t, "pyagent.py", "malloc"), j.pid, pane)
	}
}
