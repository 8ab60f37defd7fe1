package vmtest

// Running cudatrace and reading its report.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The JSON report (`cudatrace report TRACE --json`), per the CLI contract.
type report struct {
	LostEvents uint64          `json:"lost_events"`
	Processes  []reportProcess `json:"processes"`
	Stacks     []reportStack   `json:"stacks"`
	Failures   []reportFailure `json:"failures"`
	// How many frames of processes in containers nothing named.
	SymbolWarning string `json:"symbol_warning"`
	// BPF's counters (loader's names: unwound_in_bpf, ringbuf_full, …).
	Counters map[string]uint64 `json:"counters"`
}

type reportProcess struct {
	PID                    int            `json:"pid"`
	Comm                   string         `json:"comm"`
	Allocs                 uint64         `json:"allocs"`
	Frees                  uint64         `json:"frees"`
	Failed                 uint64         `json:"failed"`
	AllocBytes             uint64         `json:"alloc_bytes"`
	LiveBytes              uint64         `json:"live_bytes"`
	PeakBytes              uint64         `json:"peak_bytes"`
	HostLiveBytes          uint64         `json:"host_live_bytes"`
	UnresolvedPythonFrames int            `json:"unresolved_python_frames"`
	Devices                []reportDevice `json:"devices"`

	ImplicitFrees     uint64 `json:"implicit_frees"`
	ImplicitFreeBytes uint64 `json:"implicit_free_bytes"`
	BeforeAllocs      uint64 `json:"before_allocs"`
	BeforeBytes       uint64 `json:"before_bytes"`

	VMMMappedBytes     uint64 `json:"vmm_mapped_bytes"`
	VMMMappedPeakBytes uint64 `json:"vmm_mapped_peak_bytes"`
	VMMMaps            uint64 `json:"vmm_maps"`
	VMMUnmaps          uint64 `json:"vmm_unmaps"`
	VAReservedBytes    uint64 `json:"va_reserved_bytes"`
	VMMMappings        []struct {
		Addr     uint64 `json:"addr"`
		Size     uint64 `json:"size"`
		Device   int    `json:"device"`
		Released bool   `json:"released"`
	} `json:"vmm_mappings"`
}

type reportDevice struct {
	Device            int    `json:"device"`
	Unknown           bool   `json:"unknown"`
	LiveBytes         uint64 `json:"live_bytes"`
	PeakBytes         uint64 `json:"peak_bytes"`
	ImplicitFrees     uint64 `json:"implicit_frees"`
	ImplicitFreeBytes uint64 `json:"implicit_free_bytes"`
}

type reportStack struct {
	PID        int           `json:"pid"`
	Allocs     uint64        `json:"allocs"`
	AllocBytes uint64        `json:"alloc_bytes"`
	LiveBytes  uint64        `json:"live_bytes"`
	Frames     []reportFrame `json:"frames"`
}

type reportFrame struct {
	Function string `json:"function"`
	File     string `json:"file"`
	Line     int    `json:"line"`
	Module   string `json:"module"`
}

type reportFailure struct {
	PID    int    `json:"pid"`
	TID    int    `json:"tid"`
	API    string `json:"api"`
	Size   uint64 `json:"size"`
	Device int    `json:"device"`
	Result int    `json:"result"`
	Error  string `json:"error"`
}

// Keys the contract requires, checked before decoding so that a missing key
// does not pass for a zero.
var (
	reportKeys  = []string{"lost_events", "processes", "stacks", "failures"}
	processKeys = []string{"pid", "comm", "allocs", "frees", "failed", "alloc_bytes", "live_bytes",
		"peak_bytes", "host_live_bytes", "devices"}
	deviceKeys  = []string{"device", "live_bytes", "peak_bytes"}
	stackKeys   = []string{"pid", "allocs", "alloc_bytes", "live_bytes", "frames"}
	frameKeys   = []string{"function", "file", "line", "module"}
	failureKeys = []string{"pid", "tid", "api", "size", "device", "result", "error"}
)

func (r *report) process(pid int) *reportProcess {
	for i := range r.Processes {
		if r.Processes[i].PID == pid {
			return &r.Processes[i]
		}
	}
	return nil
}

func (r *report) pids() []int {
	var ps []int
	for _, p := range r.Processes {
		ps = append(ps, p.PID)
	}
	sort.Ints(ps)
	return ps
}

func checkKeys(raw json.RawMessage, what string, keys []string) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			return fmt.Errorf("%s lacks %q", what, k)
		}
	}
	return nil
}

func checkListKeys(raw json.RawMessage, what string, keys []string, inner func(i int, el json.RawMessage) error) error {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("%s: %v", what, err)
	}
	for i, el := range list {
		if err := checkKeys(el, fmt.Sprintf("%s[%d]", what, i), keys); err != nil {
			return err
		}
		if inner != nil {
			if err := inner(i, el); err != nil {
				return err
			}
		}
	}
	return nil
}

func decodeReport(data []byte) (*report, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, err
	}
	if err := checkKeys(data, "report", reportKeys); err != nil {
		return nil, err
	}
	field := func(el json.RawMessage, key string) json.RawMessage {
		var m map[string]json.RawMessage
		json.Unmarshal(el, &m)
		return m[key]
	}
	if err := checkListKeys(top["processes"], "processes", processKeys, func(i int, el json.RawMessage) error {
		return checkListKeys(field(el, "devices"), fmt.Sprintf("processes[%d].devices", i), deviceKeys, nil)
	}); err != nil {
		return nil, err
	}
	if err := checkListKeys(top["stacks"], "stacks", stackKeys, func(i int, el json.RawMessage) error {
		return checkListKeys(field(el, "frames"), fmt.Sprintf("stacks[%d].frames", i), frameKeys, nil)
	}); err != nil {
		return nil, err
	}
	if err := checkListKeys(top["failures"], "failures", failureKeys, nil); err != nil {
		return nil, err
	}
	var r report
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&r); err != nil {
		return nil, err
	}
	return &r, nil
}

// recording is a running `cudatrace record`.
type recording struct {
	cmd    *exec.Cmd
	stdout *lockedBuffer
	stderr *lockedBuffer // watches for "cudatrace: attached"
	done   chan struct{} // closed when it has exited
	err    error         // from Wait, once done
	start  time.Time
}

const attachedLine = "cudatrace: attached"

// recordOpts is how to run `cudatrace record`.
type recordOpts struct {
	Env []string // nil: this process's
	Dir string   // working directory; "": this process's
	// Stdin is what record (and the command it launches) reads; nil:
	// nothing.
	Stdin io.Reader
	// Wrap, when set, runs record under it: its argv, then cudatrace's
	// (unshare, to record as another host; setpriv, for the
	// capabilities the agent ships with).
	Wrap []string
}

// startRecord starts `cudatrace record ARGS...`. It is killed, with its
// process group, when the test ends; if the test failed, its output is
// logged.
func startRecord(t *testing.T, ctx context.Context, opts recordOpts, args ...string) *recording {
	t.Helper()
	argv := append(append(slices.Clone(opts.Wrap), tracerBin, "record"), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = opts.Env
	cmd.Dir = opts.Dir
	cmd.Stdin = opts.Stdin
	// Its own process group, so that what it launched goes with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A launched child holding our pipes open must not hang Wait.
	cmd.WaitDelay = 5 * time.Second
	r := &recording{cmd: cmd, stdout: newLockedBuffer(""), stderr: newLockedBuffer(attachedLine), done: make(chan struct{})}
	cmd.Stdout = r.stdout
	cmd.Stderr = r.stderr
	r.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", cmd, err)
	}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		if t.Failed() {
			t.Logf("%s\nexit: %v\nstdout:\n%s\nstderr:\n%s", cmd, r.err, truncate(r.stdout.String(), 8<<10),
				truncate(r.stderr.String(), 16<<10))
		}
	})
	return r
}

// waitAttached waits for "cudatrace: attached" on stderr.
func (r *recording) waitAttached(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.stderr.seen:
	case <-r.done:
		// It may have printed the line and exited at once.
		select {
		case <-r.stderr.seen:
		default:
			t.Fatalf("cudatrace record exited (%v) without printing %q", r.err, attachedLine)
		}
	case <-time.After(timeout):
		t.Fatalf("no %q on stderr within %v", attachedLine, timeout)
	}
}

// wait waits for record to end by itself and returns its exit code.
func (r *recording) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("cudatrace record did not end within %v", timeout)
	}
	var ee *exec.ExitError
	if r.err != nil && !errors.As(r.err, &ee) {
		t.Fatalf("cudatrace record: %v", r.err)
	}
	return r.cmd.ProcessState.ExitCode()
}

// finish waits for record to end and requires exit status 0 and a summary
// on stdout.
func (r *recording) finish(t *testing.T, timeout time.Duration) {
	t.Helper()
	if code := r.wait(t, timeout); code != 0 {
		t.Fatalf("cudatrace record exited %d, want 0", code)
	}
	if strings.TrimSpace(r.stdout.String()) == "" {
		t.Errorf("cudatrace record printed no summary on stdout")
	}
	select {
	case <-r.stderr.seen:
	default:
		t.Errorf("cudatrace record never printed %q on stderr", attachedLine)
	}
}

// runReport runs `cudatrace report TRACE --json` and decodes it. The report
// is logged if the test fails.
func runReport(t *testing.T, ctx context.Context, trace string) *report {
	t.Helper()
	return runReportArgs(t, ctx, trace)
}

// runReportArgs is runReport with more of report's flags (--top 500).
func runReportArgs(t *testing.T, ctx context.Context, trace string, args ...string) *report {
	t.Helper()
	if fi, err := os.Stat(trace); err != nil || fi.Size() == 0 {
		t.Fatalf("trace file %s: %v (size %d)", trace, err, sizeOf(fi))
	}
	cmd := exec.CommandContext(ctx, tracerBin, append([]string{"report", trace, "--json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("cudatrace report %s --json:\n%s\nstderr:\n%s", trace, truncate(stdout.String(), 64<<10), stderr.String())
		}
	})
	if err != nil {
		t.Fatalf("cudatrace report: %v", err)
	}
	rep, err := decodeReport(stdout.Bytes())
	if err != nil {
		t.Fatalf("decoding the report: %v", err)
	}
	return rep
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return 0
	}
	return fi.Size()
}

// checkProcess compares a report's account of one process with the ground
// truth: exactly, but for the peaks, which may be off by slack (events of
// different threads in flight at once reach the tracer in another order
// than they took effect).
func checkProcess(t *testing.T, rep *report, want *procTruth, slack uint64, comm string) {
	t.Helper()
	for _, p := range diffProcess(rep, want, slack, comm) {
		t.Error(p)
	}
}

// diffProcess lists what checkProcess finds wrong.
func diffProcess(rep *report, want *procTruth, slack uint64, comm string) []string {
	var probs []string
	bad := func(format string, args ...any) {
		probs = append(probs, fmt.Sprintf("pid %d: ", want.PID)+fmt.Sprintf(format, args...))
	}
	got := rep.process(want.PID)
	if got == nil {
		bad("not in the report (pids %v); truth: %v", rep.pids(), want)
		return probs
	}
	eq := func(name string, g, w uint64) {
		if g != w {
			bad("%s = %d, want %d", name, g, w)
		}
	}
	eq("allocs", got.Allocs, want.Allocs)
	eq("frees", got.Frees, want.Frees)
	eq("failed", got.Failed, want.Failed)
	eq("alloc_bytes", got.AllocBytes, want.AllocBytes)
	eq("live_bytes", got.LiveBytes, want.Live)
	eq("host_live_bytes", got.HostLiveBytes, want.HostLive)
	eq("vmm_mapped_bytes", got.VMMMappedBytes, want.Mapped)
	eq("vmm_mapped_peak_bytes", got.VMMMappedPeakBytes, want.MappedPeak)
	eq("vmm_maps", got.VMMMaps, want.Maps)
	eq("vmm_unmaps", got.VMMUnmaps, want.Unmaps)
	eq("va_reserved_bytes", got.VAReservedBytes, want.Reserved)
	eq("implicit_frees", got.ImplicitFrees, want.ImplicitFrees)
	eq("implicit_free_bytes", got.ImplicitFreeBytes, want.ImplicitFreeBytes)
	within := func(name string, g, w uint64) {
		lo := uint64(0)
		if w > slack {
			lo = w - slack
		}
		if g < lo || g > w+slack {
			bad("%s = %d, want %d (within %d)", name, g, w, slack)
		}
	}
	within("peak_bytes", got.PeakBytes, want.Peak)
	if comm != "" && got.Comm != comm {
		bad("comm %q, want %q", got.Comm, comm)
	}

	// Devices: every device in either; one missing from the report has
	// nothing live.
	gotDev := map[int]reportDevice{}
	for _, d := range got.Devices {
		if _, dup := gotDev[d.Device]; dup {
			bad("device %d listed twice", d.Device)
		}
		gotDev[d.Device] = d
	}
	for _, d := range want.DeviceList() {
		w := want.Devices[d]
		g, ok := gotDev[d]
		if !ok {
			bad("device %d missing (truth live %d, peak %d)", d, w.Live, w.Peak)
			continue
		}
		eq(fmt.Sprintf("device %d live_bytes", d), g.LiveBytes, w.Live)
		eq(fmt.Sprintf("device %d implicit_frees", d), g.ImplicitFrees, w.ImplicitFrees)
		eq(fmt.Sprintf("device %d implicit_free_bytes", d), g.ImplicitFreeBytes, w.ImplicitFreeBytes)
		within(fmt.Sprintf("device %d peak_bytes", d), g.PeakBytes, w.Peak)
	}
	for d, g := range gotDev {
		if want.Devices[d] == nil && (g.LiveBytes != 0 || g.PeakBytes != 0) {
			bad("device %d has live %d, peak %d; the process never used it", d, g.LiveBytes, g.PeakBytes)
		}
	}

	// Failures: the same calls, by API, error, device, and size where the
	// tracer can know it; the error named right.
	gotFail := map[string]int{}
	byName, wantByName := map[string]int{}, map[string]int{}
	for _, f := range rep.Failures {
		if f.PID != want.PID {
			continue
		}
		gotFail[failureKey(f.API, f.Result, f.Device, f.Size)]++
		byName[f.Error]++
		if n, ok := errorName(f.API, f.Result); ok && f.Error != n {
			bad("failure %+v: error %q, want %q", f, f.Error, n)
		}
		if !want.Threads[f.TID] {
			bad("failure %+v: tid %d made no call", f, f.TID)
		}
	}
	for _, f := range want.Failures {
		n, _ := errorName(f.API, f.Ret)
		wantByName[n]++
	}
	if !equalCounts(byName, wantByName) {
		bad("failures by error name %v, want %v", byName, wantByName)
	}
	if w := want.FailureKeys(); !equalCounts(gotFail, w) {
		bad("failures differ:\n%s", diffCounts(gotFail, w))
	}
	return probs
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func diffCounts(got, want map[string]int) string {
	var lines []string
	for k, w := range want {
		if got[k] != w {
			lines = append(lines, fmt.Sprintf("  %s: got %d, want %d", k, got[k], w))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			lines = append(lines, fmt.Sprintf("  %s: got %d, want 0", k, g))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// checkNoOtherProcesses fails on a reported process with activity that the
// ground truth does not know.
func checkNoOtherProcesses(t *testing.T, rep *report, truths map[int]*procTruth) {
	t.Helper()
	for _, p := range rep.Processes {
		if truths[p.PID] == nil && (p.Allocs != 0 || p.Failed != 0 || p.Frees != 0) {
			t.Errorf("report has pid %d (%s: %d allocs, %d failed) that made no traced call", p.PID, p.Comm, p.Allocs, p.Failed)
		}
	}
}

// checkStacks checks the stacks of one process: their totals stay within
// the process's, and some stack holds every one of the functions named, all
// in module, with a source line.
func checkStacks(t *testing.T, rep *report, pid int, module string, funcs ...string) {
	t.Helper()
	for _, p := range diffStacks(rep, pid, module, funcs...) {
		t.Error(p)
	}
}

// diffStacks lists what checkStacks finds wrong.
func diffStacks(rep *report, pid int, module string, funcs ...string) []string {
	var probs []string
	bad := func(format string, args ...any) {
		probs = append(probs, fmt.Sprintf("pid %d: ", pid)+fmt.Sprintf(format, args...))
	}
	var allocs, bytes uint64
	found := false
	var seen []string
	for _, s := range rep.Stacks {
		if s.PID != pid {
			continue
		}
		allocs += s.Allocs
		bytes += s.AllocBytes
		have := map[string]reportFrame{}
		var names []string
		for _, f := range s.Frames {
			names = append(names, f.Function)
			if f.Module == module {
				if _, dup := have[f.Function]; !dup {
					have[f.Function] = f
				}
			}
		}
		if len(seen) < 10 {
			seen = append(seen, strings.Join(names, " < "))
		}
		ok := true
		for _, fn := range funcs {
			if _, in := have[fn]; !in {
				ok = false
			}
		}
		if ok && !found {
			found = true
			// Built with -g: the workload's frames have source lines.
			for _, fn := range funcs {
				if f := have[fn]; filepath.Base(f.File) != filepath.Base(module)+".c" || f.Line <= 0 {
					bad("frame %+v: want file %s.c and a line", f, filepath.Base(module))
				}
			}
		}
	}
	if p := rep.process(pid); p != nil && (allocs > p.Allocs || bytes > p.AllocBytes) {
		bad("stacks add up to %d allocs, %d bytes; the process made %d, %d", allocs, bytes, p.Allocs, p.AllocBytes)
	}
	if !found {
		bad("no stack holds all of %v in module %s; stacks (innermost first):\n  %s",
			funcs, module, strings.Join(seen, "\n  "))
	}
	return probs
}

// checkMixTrace: the trace of the mix workload (threads threads, logging
// its truth to log) is exact against that truth, lost nothing, holds no
// other process, and names mix's allocating stacks.
func checkMixTrace(t *testing.T, ctx context.Context, log, trace string, threads int) {
	t.Helper()
	want := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, peakSlack(want, threads), "mix")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	mix := workload("mix")
	checkStacks(t, rep, want.PID, mix, "alloc_device_buffer", "worker_main")
	checkStacks(t, rep, want.PID, mix, "alloc_pinned_staging", "worker_main")
	checkStacks(t, rep, want.PID, mix, "alloc_device_buffer", "setup_context", "main")
}

// peakSlack bounds how far a peak may be off when threads run at once:
// each can have one call in flight, an allocation made but not recorded
// yet or a free recorded at its entry but not made yet, of at most the
// most one of its calls changes (a cuMemUnmap may free several handles):
// the sum over the threads most off, at most threads of them.
func peakSlack(p *procTruth, threads int) uint64 {
	steps := slices.Sorted(maps.Values(p.MaxStep))
	slices.Reverse(steps)
	var slack uint64
	for _, s := range steps[:min(threads, len(steps))] {
		slack += s
	}
	return slack
}

// bpfProg is one program from `bpftool -j prog show`.
type bpfProg struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
	Pids []struct {
		Pid  int    `json:"pid"`
		Comm string `json:"comm"`
	} `json:"pids"`
}

// ctProgs lists the loaded BPF programs whose names start with "ct_".
func ctProgs(ctx context.Context) ([]bpfProg, error) {
	out, err := exec.CommandContext(ctx, "bpftool", "-j", "prog", "show").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("bpftool -j prog show: %v\n%s", err, ee.Stderr)
		}
		return nil, err
	}
	var all []bpfProg
	if err := json.Unmarshal(out, &all); err != nil {
		return nil, fmt.Errorf("bpftool -j prog show: %v", err)
	}
	var ct []bpfProg
	for _, p := range all {
		if strings.HasPrefix(p.Name, "ct_") {
			ct = append(ct, p)
		}
	}
	return ct, nil
}
