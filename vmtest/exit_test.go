package vmtest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// exitleakRE is exitleak's tally of what it leaks on a device.
var exitleakRE = regexp.MustCompile(`(?m)^leak device=(\d) allocs=(\d+) bytes=(\d+)$`)

// exitTally is what exitleak leaks per device: allocations and bytes.
type exitTally map[int32][2]uint64

func parseExitTally(t *testing.T, out string) exitTally {
	t.Helper()
	tally := exitTally{}
	for _, m := range exitleakRE.FindAllStringSubmatch(out, -1) {
		d, _ := strconv.Atoi(m[1])
		n, _ := strconv.ParseUint(m[2], 10, 64)
		b, _ := strconv.ParseUint(m[3], 10, 64)
		tally[int32(d)] = [2]uint64{n, b}
	}
	if len(tally) != 2 || tally[0][1] == 0 || tally[1][1] == 0 {
		t.Fatalf("exitleak's tally: %v from %q", tally, out)
	}
	return tally
}

// exitReport is what a report says of a process's end.
type exitReport struct {
	Processes []struct {
		PID              int    `json:"pid"`
		Exited           bool   `json:"exited"`
		Frees            uint64 `json:"frees"`
		ImplicitFrees    uint64 `json:"implicit_frees"`
		LiveBytes        uint64 `json:"live_bytes"`
		LiveAllocations  int    `json:"live_allocations"`
		HeldAtExitAllocs uint64 `json:"held_at_exit_allocs"`
		HeldAtExitBytes  uint64 `json:"held_at_exit_bytes"`
		Devices          []struct {
			Device           int32  `json:"device"`
			LiveBytes        uint64 `json:"live_bytes"`
			HeldAtExitAllocs uint64 `json:"held_at_exit_allocs"`
			HeldAtExitBytes  uint64 `json:"held_at_exit_bytes"`
		} `json:"devices"`
	} `json:"processes"`
}

// checkHeldAtExit requires the report of trace to say that pid ended
// holding exactly tally, per device and in all, with that figure as its
// live set at the end, and no free counted for it. pid 0: the report's
// only process.
func checkHeldAtExit(t *testing.T, ctx context.Context, trace string, pid int, tally exitTally, frees uint64) {
	t.Helper()
	rep := exitReportOf(t, ctx, trace)
	if pid == 0 && len(rep.Processes) == 1 {
		pid = rep.Processes[0].PID
	}
	found := false
	for _, p := range rep.Processes {
		if p.PID != pid {
			continue
		}
		found = true
		want := tally[0][0] + tally[1][0]
		bytes := tally[0][1] + tally[1][1]
		if !p.Exited || p.HeldAtExitAllocs != want || p.HeldAtExitBytes != bytes || p.LiveBytes != bytes ||
			p.LiveAllocations != int(want) || p.Frees != frees || p.ImplicitFrees != 0 {
			t.Errorf("pid %d: exited %v, held at exit %d allocs %d bytes, live %d bytes in %d, frees %d, implicit %d; "+
				"want exited, %d allocs %d bytes held and live, %d frees, 0 implicit",
				pid, p.Exited, p.HeldAtExitAllocs, p.HeldAtExitBytes, p.LiveBytes, p.LiveAllocations, p.Frees, p.ImplicitFrees,
				want, bytes, frees)
		}
		if len(p.Devices) != 2 {
			t.Fatalf("pid %d: devices %+v, want 0 and 1", pid, p.Devices)
		}
		for _, d := range p.Devices {
			w := tally[d.Device]
			if d.HeldAtExitAllocs != w[0] || d.HeldAtExitBytes != w[1] || d.LiveBytes != w[1] {
				t.Errorf("pid %d gpu %d: held at exit %d allocs %d bytes, live %d; want %d allocs %d bytes",
					pid, d.Device, d.HeldAtExitAllocs, d.HeldAtExitBytes, d.LiveBytes, w[0], w[1])
			}
		}
	}
	if !found {
		t.Fatalf("report of %s has no pid %d", trace, pid)
	}
}

// exitReportOf runs `cudatrace report TRACE --json` and decodes what it
// says of the processes' ends.
func exitReportOf(t *testing.T, ctx context.Context, trace string) exitReport {
	t.Helper()
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatalf("cudatrace report %s: %v", trace, err)
	}
	var rep exitReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("report of %s: %v", trace, err)
	}
	return rep
}

// checkExited requires the report of trace to say pid ended (its exit
// record, bpf/exit.h).
func checkExited(t *testing.T, ctx context.Context, trace string, pid int) {
	t.Helper()
	rep := exitReportOf(t, ctx, trace)
	for _, p := range rep.Processes {
		if p.PID == pid && !p.Exited {
			t.Errorf("%s: pid %d not reported as exited (no exit record)", trace, pid)
		}
	}
}

// TestExitHeld: a process that leaks on two devices and ends (its group
// leader first: the process ends with its last thread) is reported as
// holding exactly what it leaked at exit, per device; the agent releases
// it: its live metrics go, and a window over its end says what it held.
func TestExitHeld(t *testing.T) {
	ctx, dir := traceSetup(t)

	t.Run("record", func(t *testing.T) {
		trace := filepath.Join(dir, "exit.trace")
		rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "-o", trace, "--", workload("exitleak"))
		rec.finish(t, 50*time.Second)
		tally := parseExitTally(t, rec.stdout.String())
		checkHeldAtExit(t, ctx, trace, 0, tally, 1)
	})

	t.Run("agent", func(t *testing.T) {
		ag := startAgent(t, ctx)
		cmd := exec.CommandContext(ctx, workload("exitleak"))
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
		defer cmd.Process.Kill()
		r := bufio.NewReader(stdout)
		if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
			t.Fatalf("exitleak said %q (%v), want ready", line, err)
		}
		pid := strconv.Itoa(cmd.Process.Pid)
		// Before its end: its memory is live in the metrics.
		var m []sample
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
			if _, ok := metric(t, m, "cudatrace_live_bytes", "pid", pid, "gpu", "1", "level", "segment"); ok || time.Now().After(deadline) {
				break
			}
		}
		wantMetric(t, m, 1<<20, "cudatrace_live_bytes", "pid", pid, "gpu", "0", "level", "segment")
		wantMetric(t, m, 2<<20, "cudatrace_live_bytes", "pid", pid, "gpu", "1", "level", "segment")

		trace := filepath.Join(dir, "window.trace")
		var rest string
		traceWindow(t, ag.url, cmd.Process.Pid, 4, trace, func() {
			fmt.Fprintln(stdin, "go")
			b, _ := io.ReadAll(r)
			rest = string(b)
			if err := cmd.Wait(); err != nil {
				t.Errorf("exitleak: %v", err)
			}
		})
		tally := parseExitTally(t, rest)
		// The window began with the process's live set (1 MiB and 2 MiB):
		// what it held at exit is all of its leaks; the frees in the
		// window: none.
		checkHeldAtExit(t, ctx, trace, cmd.Process.Pid, tally, 0)

		// After its end: nothing of it is live in the metrics.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
			var live []string
			for _, s := range m {
				if s.name == "cudatrace_live_bytes" && s.labels["pid"] == pid && s.value != 0 {
					live = append(live, fmt.Sprintf("%v=%v", s.labels, s.value))
				}
			}
			if len(live) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %s still live in the metrics after it ended: %s", pid, strings.Join(live, ", "))
			}
		}
		ag.stop(t)
	})
}

// TestAttachContextDestroyed: a context made current before an attach, in
// which the process allocates before saying which context is current
// (device and context unknown), then destroys it: the driver frees what
// was allocated in it, and cudatrace counts those implicit frees exactly
// once the thread's cuCtxGetCurrent has told it the context. The driver
// then reuses an address of that memory: the memviz export stays valid.
func TestAttachContextDestroyed(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "destroy.trace")
	p := startReady(t, log, "attach_ctx", "destroy")
	pid := p.cmd.Process.Pid
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeDriver, "--pid", strconv.Itoa(pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Fatalf("attach_ctx destroy: %v\n%s", err, p.stderr.String())
	}
	rec.finish(t, 20*time.Second)

	const mib = 1 << 20
	rep := runReport(t, ctx, trace)
	rp := rep.process(pid)
	if rp == nil {
		t.Fatalf("no process %d in the report (pids %v)", pid, rep.pids())
	}
	// After the attach: 2 and 3 MiB in the context made unseen (device
	// unknown), both freed with it; 2 MiB in the new one (device 1).
	if rp.ImplicitFrees != 2 || rp.ImplicitFreeBytes != 5*mib || rp.Allocs != 3 || rp.Frees != 0 {
		t.Errorf("pid %d: implicit frees %d (%d bytes), allocs %d, frees %d; want 2 (%d), 3, 0",
			pid, rp.ImplicitFrees, rp.ImplicitFreeBytes, rp.Allocs, rp.Frees, 5*mib)
	}
	live := map[int]uint64{}
	for _, d := range rp.Devices {
		live[d.Device] = d.LiveBytes
	}
	if live[unknownDevice] != 0 || live[1] != 2*mib {
		t.Errorf("pid %d: live bytes at its end by device %v, want 2 MiB on device 1, none unknown", pid, live)
	}
	checkMemvizExport(t, ctx, trace, pid)
}

// TestAttachContextPopped: PyCUDA's ctx.pop(); ctx.detach() of a context
// made current before an attach, which the thread never names otherwise
// (testdata/attach_ctx.c, mode pop): what it allocated in it after the
// attach, on the device unknown and (after cuCtxGetDevice) on device 1,
// is freed with it, and cudatrace counts those implicit frees exactly,
// per device, as the stand-in's log has them: the pop's return tells the
// context popped. With cuCtxPopCurrent_v2, and with cuCtxPopCurrent, its
// name before CUDA 4.0.
func TestAttachContextPopped(t *testing.T) {
	for _, mode := range []string{"pop", "popv1"} {
		t.Run(mode, func(t *testing.T) { attachContextPopped(t, mode) })
	}
}

func attachContextPopped(t *testing.T, mode string) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "pop.trace")
	p := startReady(t, log, "attach_ctx", mode)
	pid := p.cmd.Process.Pid
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeDriver, "--pid", strconv.Itoa(pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Fatalf("attach_ctx %s: %v\n%s", mode, err, p.stderr.String())
	}
	rec.finish(t, 20*time.Second)

	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	// What the driver frees with the context that a tracer never saw made
	// (the 1 MiB allocated before the attach) is not this trace's.
	made := map[uint64]bool{}
	var seen []logCall
	started := false
	for _, c := range calls {
		started = started || c.API == "PHASE2"
		if started && classOf(c.API) == classAlloc {
			made[c.Ptr] = true
		}
		if c.API != "implicit_free" || made[c.Ptr] {
			seen = append(seen, c)
		}
	}
	truths, err := groundTruth(untold(seen, "PHASE2"), "PHASE2")
	if err != nil || len(truths) != 1 || truths[pid] == nil {
		t.Fatalf("ground truth: %v, %v; want pid %d only", truths, err, pid)
	}
	want := truths[pid]
	// By hand from attach_ctx.c: 2 MiB on the device unknown, 3 MiB on
	// device 1, both freed with the context.
	const mib = 1 << 20
	if want.ImplicitFrees != 2 || want.Live != 0 || want.Devices[unknownDevice] == nil || want.Devices[1] == nil ||
		want.Devices[unknownDevice].ImplicitFreeBytes != 2*mib || want.Devices[1].ImplicitFreeBytes != 3*mib {
		t.Fatalf("ground truth: %v; want 2 implicit frees (2 MiB unknown, 3 MiB on device 1), nothing live", want)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "")
	rp := rep.process(pid)
	if rp == nil {
		t.Fatalf("no process %d in the report (pids %v)", pid, rep.pids())
	}
	if rp.ImplicitFrees != 2 || rp.ImplicitFreeBytes != 5*mib {
		t.Errorf("pid %d: implicit frees %d (%d bytes), want 2 (%d)", pid, rp.ImplicitFrees, rp.ImplicitFreeBytes, 5*mib)
	}
	checkMemvizExport(t, ctx, trace, pid)
}
