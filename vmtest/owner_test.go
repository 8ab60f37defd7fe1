package vmtest

// Where the GPU memory went (issue 22): by owner, from stand-ins named and
// behaving as PyTorch's caching allocator, NCCL and cuBLAS (owners.c), in
// the report, the pprof export and the agent's metrics; record's budgets;
// and diff of two runs of the demo workload. Privileged.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

const mib = 1 << 20

// What owners.c leaves, per device and owner, at the end and at its peak.
var (
	ownersAtEnd  = map[string]uint64{"0 pytorch": 4 * mib, "0 application": 5 * mib, "1 nccl": 4 * mib}
	ownersAtPeak = map[string]uint64{"0 pytorch": 4 * mib, "0 application": 69 * mib, "0 cublas": 3 * mib, "1 nccl": 4 * mib}
)

// recordOwners records owners.c (with args) and returns the trace, record's
// exit code and its stderr.
func recordOwners(t *testing.T, ctx context.Context, dir string, flags []string, args ...string) (string, int, string) {
	t.Helper()
	trace := filepath.Join(dir, fmt.Sprintf("owners%d.trace", time.Now().UnixNano()))
	all := append([]string{"--lib", fakeLib, "--lib", fakeDriver, "-o", trace}, flags...)
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv("")}, append(append(all, "--", workload("owners")), args...)...)
	code := rec.wait(t, 45*time.Second)
	return trace, code, rec.stderr.String()
}

type ownerShare struct {
	Device    int    `json:"device"`
	Owner     string `json:"owner"`
	Module    string `json:"module"`
	LiveBytes uint64 `json:"live_bytes"`
	LiveCount uint64 `json:"live_count"`
}

func byDeviceOwner(rows []ownerShare) map[string]uint64 {
	out := map[string]uint64{}
	for _, r := range rows {
		out[fmt.Sprintf("%d %s", r.Device, r.Owner)] += r.LiveBytes
	}
	return out
}

// TestOwners: report --json's owners, at the end and at the peak, and the
// pprof export's owner label, exact to the byte.
func TestOwners(t *testing.T) {
	ctx, dir := traceSetup(t)
	trace, code, stderr := recordOwners(t, ctx, dir, nil)
	if code != 0 {
		t.Fatalf("record exited %d:\n%s", code, stderr)
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	var rep struct {
		Processes []struct {
			PID       int    `json:"pid"`
			LiveBytes uint64 `json:"live_bytes"`
			PeakBytes uint64 `json:"peak_bytes"`
		} `json:"processes"`
		Owners []struct {
			PID  int          `json:"pid"`
			End  []ownerShare `json:"end"`
			Peak []ownerShare `json:"peak"`
		} `json:"owners"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Owners) != 1 || len(rep.Processes) != 1 || rep.Owners[0].PID != rep.Processes[0].PID {
		t.Fatalf("owners %+v of processes %+v, want one process", rep.Owners, rep.Processes)
	}
	o := rep.Owners[0]
	if got := byDeviceOwner(o.End); !reflect.DeepEqual(got, ownersAtEnd) {
		t.Errorf("owners at the end %v, want %v", got, ownersAtEnd)
	}
	if got := byDeviceOwner(o.Peak); !reflect.DeepEqual(got, ownersAtPeak) {
		t.Errorf("owners at the peak %v, want %v", got, ownersAtPeak)
	}
	if p := rep.Processes[0]; p.LiveBytes != 13*mib || p.PeakBytes != 80*mib {
		t.Errorf("live %d, peak %d: the owners' rows must add up to them", p.LiveBytes, p.PeakBytes)
	}
	for _, r := range o.End {
		if r.Owner == "application" && r.Module != "owners" {
			t.Errorf("the application's module is %q, want owners", r.Module)
		}
	}

	for _, at := range []struct {
		at   string
		want map[string]uint64
	}{{"end", ownersAtEnd}, {"peak", ownersAtPeak}} {
		pb := filepath.Join(dir, at.at+".pb.gz")
		if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "pprof", "--at", at.at, "-o", pb).CombinedOutput(); err != nil {
			t.Fatalf("export --at %s: %v\n%s", at.at, err, out)
		}
		f, err := os.Open(pb)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]uint64{}
		for _, s := range p.Sample {
			if v := s.Value[3]; v > 0 { // inuse_space
				got[s.Label["device"][0]+" "+strings.Join(s.Label["owner"], ",")] += uint64(v)
			}
		}
		if !reflect.DeepEqual(got, at.want) {
			t.Errorf("pprof --at %s inuse_space by device and owner label %v, want %v", at.at, got, at.want)
		}
	}
}

// TestOwnersAgent: the agent's owner_live_bytes for a running owners.c.
func TestOwnersAgent(t *testing.T) {
	ctx, _ := traceSetup(t)
	ag := startAgentEnv(t, ctx, fakeEnv(""), "--lib", fakeLib, "--lib", fakeDriver, "--dump-dir", "")
	cmd := exec.CommandContext(ctx, workload("owners"), "wait")
	cmd.Env = fakeEnv("")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "owners: ready" {
				ready <- true
				break
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("owners did not get ready within 30s")
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	// The agent applies events as they come: wait for the last of them.
	var m []sample
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		if v, _ := metric(t, m, "cudatrace_live_bytes", "pid", pid, "gpu", "0", "level", "segment"); v == 9*mib || time.Now().After(deadline) {
			break
		}
	}
	for k, want := range ownersAtEnd {
		gpu, owner, _ := strings.Cut(k, " ")
		wantMetric(t, m, want, "cudatrace_owner_live_bytes", "pid", pid, "gpu", gpu, "owner", owner)
	}
	n := 0
	for _, s := range m {
		if s.name == "cudatrace_owner_live_bytes" && s.labels["pid"] == pid {
			n++
		}
	}
	if n != len(ownersAtEnd) {
		t.Errorf("%d owner_live_bytes series for pid %s, want %d (cuBLAS's workspace was freed)", n, pid, len(ownersAtEnd))
	}
	stdin.Close()
	ag.stop(t)
}

// TestRecordBudget: record --max-peak and --max-live-at-exit exit 122 over
// budget, with a line naming the budget, the excess and the stacks, and 0
// under it; a command that failed keeps its own exit status.
func TestRecordBudget(t *testing.T) {
	ctx, dir := traceSetup(t)
	for _, c := range []struct {
		name  string
		flags []string
		args  []string
		code  int
		lines []string // "" for none
	}{
		{"under", []string{"--max-peak", "80MiB", "--max-live-at-exit", "13MiB"}, nil, 0, nil},
		{"peak over", []string{"--max-peak", "64MiB"}, nil, 122, []string{
			"peaked at 80.0 MiB of GPU memory, 16.0 MiB over --max-peak 64MiB; held at the peak by: 64.0 MiB scratch_buffer (owners.c:",
			"; 5.0 MiB own_buffer (owners.c:"}},
		{"live over", []string{"--max-live-at-exit", "8MiB", "--max-peak", "1GiB"}, nil, 122, []string{
			"held 13.0 MiB of GPU memory at exit, 5.0 MiB over --max-live-at-exit 8MiB; held by: 5.0 MiB own_buffer (owners.c:"}},
		{"command failed", []string{"--max-peak", "64MiB"}, []string{"exit", "3"}, 3, []string{
			"16.0 MiB over --max-peak 64MiB"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, code, stderr := recordOwners(t, ctx, dir, c.flags, c.args...)
			if code != c.code {
				t.Errorf("record exited %d, want %d:\n%s", code, c.code, stderr)
			}
			n := strings.Count(stderr, "cudatrace: over budget: ")
			if want := min(len(c.lines), 1); n != want {
				t.Errorf("%d over-budget lines, want %d:\n%s", n, want, stderr)
			}
			for _, l := range c.lines {
				if !strings.Contains(stderr, l) {
					t.Errorf("stderr lacks %q:\n%s", l, stderr)
				}
			}
		})
	}
}

// TestDiffDemo: two runs of make demo's workload, with 512 and 640 MiB of
// weights: diff says +128 MiB at the peak, at the end, for the application,
// and for load_weights' stack alone, matched across the runs' addresses.
func TestDiffDemo(t *testing.T) {
	ctx, dir := traceSetup(t)
	var traces []string
	for _, weights := range []string{"512", "640"} {
		trace := filepath.Join(dir, "demo"+weights+".trace")
		rec := startRecord(t, ctx, recordOpts{Env: fakeEnv("")}, "--lib", fakeLib, "-q", "-o", trace, "--", workload("train"), weights)
		rec.finish(t, 45*time.Second)
		traces = append(traces, trace)
	}
	out, err := exec.CommandContext(ctx, tracerBin, "diff", traces[0], traces[1], "--json").Output()
	if err != nil {
		t.Fatalf("diff: %v", err)
	}
	type delta struct{ A, B, Delta int64 }
	var d struct {
		Peak   delta `json:"peak_bytes"`
		Live   delta `json:"live_bytes"`
		Owners []struct {
			Owner string
			Live  delta `json:"live_bytes"`
			Peak  delta `json:"peak_bytes"`
		} `json:"owners"`
		Stacks []struct {
			Live   delta `json:"live_bytes"`
			Peak   delta `json:"peak_bytes"`
			Alloc  delta `json:"alloc_bytes"`
			Frames []reportFrame
		} `json:"stacks"`
		Unchanged int `json:"unchanged_stacks"`
	}
	if err := json.Unmarshal(out, &d); err != nil {
		t.Fatal(err)
	}
	// 512 MiB of weights, 256 of optimizer state (managed), 100 of leaked
	// metrics, and evaluation's 256 MiB gradient (its 512 MiB activations
	// fail: 1 GiB per device) at the peak, the optimizer's state freed at
	// the end; 128 MiB more of each with 640 MiB of weights.
	if want := (delta{1124 * mib, 1252 * mib, 128 * mib}); d.Peak != want {
		t.Errorf("peak %+v, want %+v", d.Peak, want)
	}
	if want := (delta{868 * mib, 996 * mib, 128 * mib}); d.Live != want {
		t.Errorf("live %+v, want %+v", d.Live, want)
	}
	if len(d.Owners) != 1 || d.Owners[0].Owner != "application" || d.Owners[0].Live != (delta{868 * mib, 996 * mib, 128 * mib}) ||
		d.Owners[0].Peak != (delta{1124 * mib, 1252 * mib, 128 * mib}) {
		t.Errorf("owners %+v", d.Owners)
	}
	w := delta{512 * mib, 640 * mib, 128 * mib}
	if len(d.Stacks) != 1 || d.Stacks[0].Live != w || d.Stacks[0].Peak != w || d.Stacks[0].Alloc != w ||
		len(d.Stacks[0].Frames) < 2 || d.Stacks[0].Frames[0].Function != "cuda_alloc" || d.Stacks[0].Frames[1].Function != "load_weights" {
		t.Errorf("changed stacks %+v, want load_weights' alone", d.Stacks)
	}
	if d.Unchanged < 5 {
		t.Errorf("%d stacks unchanged: the others must match across the runs", d.Unchanged)
	}
	text, err := exec.CommandContext(ctx, tracerBin, "diff", traces[0], traces[1]).Output()
	if err != nil {
		t.Fatalf("diff: %v", err)
	}
	if !regexp.MustCompile(`(?m)^peak +1\.1 GiB +1\.2 GiB +\+128\.0 MiB$`).Match(text) ||
		!strings.Contains(string(text), "#1 load_weights (") {
		t.Errorf("diff text:\n%s", text)
	}
}
