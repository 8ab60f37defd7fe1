package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// unknownDevice is the report's device for memory whose device was not
// known when it was allocated (events.DeviceUnknown).
const unknownDevice = -1

// attachDeviceTruth is, per process, the bytes allocated after the marker
// PHASE2 by device, from the stand-in's log: those between a process's
// markers UNSEEN and SEEN on unknownDevice, where nothing the process did
// under the tracer said the device yet.
func attachDeviceTruth(t *testing.T, log string) map[int]map[int]uint64 {
	t.Helper()
	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]map[int]uint64{}
	traced, unseen := map[int]bool{}, map[int]bool{}
	for _, c := range calls {
		switch c.API {
		case "PHASE2":
			traced[c.PID] = true
			out[c.PID] = map[int]uint64{}
		case "UNSEEN":
			unseen[c.PID] = true
		case "SEEN":
			unseen[c.PID] = false
		}
		if !traced[c.PID] || classOf(c.API) != classAlloc || c.Ret != 0 {
			continue
		}
		dev := c.Dev
		if unseen[c.PID] {
			dev = unknownDevice
		}
		out[c.PID][dev] += c.Size
	}
	return out
}

// TestAttachDevices: `record --pid` on processes whose threads made
// device 1 current before the attach (testdata/attach_ctx.c), through the
// driver (a context made current) and through the runtime
// (cudaSetDevice). What a thread allocates before its own calls say its
// device is reported on the device "unknown", never a guessed one; after
// them (cuCtxGetCurrent and cuCtxGetDevice, as Numba asks before each
// call; cudaGetDevice), exact per device against the stand-in's log, a
// context pushed and popped included, and a thread started after the
// attach on the runtime's default device 0.
func TestAttachDevices(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "devices.trace")
	drv := startReady(t, log, "attach_ctx", "drv")
	rt := startReady(t, log, "attach_ctx", "rt")
	pids := []int{drv.cmd.Process.Pid, rt.cmd.Process.Pid}
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--lib", fakeDriver,
		"--pid", strconv.Itoa(pids[0]), "--pid", strconv.Itoa(pids[1]), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	for _, p := range []*attachLater{drv, rt} {
		p.proceed(t)
		if err := p.wait(t); err != nil {
			t.Fatalf("attach_ctx: %v\n%s", err, p.stderr.String())
		}
	}
	rec.finish(t, 20*time.Second)

	want := attachDeviceTruth(t, log)
	const mib = 1 << 20
	// The log's own account, by hand from attach_ctx.c.
	wantDrv := map[int]uint64{unknownDevice: 5 * mib, 0: mib / 2, 1: 19 * mib}
	wantRt := map[int]uint64{unknownDevice: 5 * mib, 0: 9 * mib, 1: 6 * mib}
	if !maps.Equal(want[pids[0]], wantDrv) || !maps.Equal(want[pids[1]], wantRt) {
		t.Fatalf("ground truth by device: %v, want %v and %v", want, wantDrv, wantRt)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	for _, pid := range pids {
		p := rep.process(pid)
		if p == nil {
			t.Fatalf("no process %d in the report (pids %v)", pid, rep.pids())
		}
		got := map[int]uint64{}
		for _, d := range p.Devices {
			got[d.Device] = d.LiveBytes
			if d.Unknown != (d.Device == unknownDevice) {
				t.Errorf("pid %d device %d: unknown = %v", pid, d.Device, d.Unknown)
			}
		}
		if !maps.Equal(got, want[pid]) {
			t.Errorf("pid %d: live bytes by device %v, want %v", pid, got, want[pid])
		}
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace).CombinedOutput()
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), "gpu unknown"); n != 2 {
		t.Errorf("report text has %d rows \"gpu unknown\", want 2 (one per process):\n%s", n, out)
	}
	for _, pid := range pids {
		checkMemvizExport(t, ctx, trace, pid)
	}
}

// TestAgentWindowStartsLive: an agent's /trace window starts with the
// agent's live set (issue 17): its report's memory made before the window
// equals what /metrics said when it opened, and at its end its live bytes
// per device are /metrics' then; its memviz export lists every segment
// its entries touch, the older ones with no entry of their making.
func TestAgentWindowStartsLive(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "window.trace")
	ag := startAgent(t, ctx)
	j := startJob(t, ctx, log)
	j.do(t, "ok", "weights %d 0", 1000000)
	j.do(t, "ok", "weights %d 1", 3000000)
	j.do(t, "ok", "step %d", 5000)

	pid := strconv.Itoa(j.pid)
	live := func(m []sample) (devs map[int]uint64, total uint64) {
		devs = map[int]uint64{}
		for _, gpu := range []int{0, 1} {
			v, _ := metric(t, m, "cudatrace_live_bytes", "pid", pid, "gpu", strconv.Itoa(gpu), "level", "segment")
			devs[gpu] = uint64(v)
			total += uint64(v)
		}
		host, _ := metric(t, m, "cudatrace_host_live_bytes", "pid", pid)
		return devs, total + uint64(host)
	}
	// The agent has the job's records once its count says so.
	var atStart uint64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, atStart = live(parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK)))
		if atStart >= 4000000 || time.Now().After(deadline) {
			break
		}
	}
	if atStart < 4000000 {
		t.Fatalf("/metrics: pid %s holds %d bytes, want the 4000000 its weights hold at least", pid, atStart)
	}
	traceWindow(t, ag.url, j.pid, 2, trace, func() {
		j.do(t, "ok", "weights %d 0", 777)
		j.do(t, "ok", "step %d", 6000)
	})
	atEnd, _ := live(parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK)))

	rep := runReport(t, ctx, trace)
	p := rep.process(j.pid)
	if p == nil {
		t.Fatalf("no pid %d in the window's report (pids %v)", j.pid, rep.pids())
	}
	if p.BeforeBytes != atStart {
		t.Errorf("window's memory from before it: %d bytes, want the %d /metrics said when it opened", p.BeforeBytes, atStart)
	}
	got := map[int]uint64{}
	for _, d := range p.Devices {
		got[d.Device] = d.LiveBytes
	}
	if !maps.Equal(got, atEnd) {
		t.Errorf("window's live bytes by device %v, want /metrics' %v", got, atEnd)
	}
	if p.Allocs != 2 || p.AllocBytes != 777+6000 {
		t.Errorf("window's allocations: %d, %d bytes; want the 2 made in it, %d bytes", p.Allocs, p.AllocBytes, 777+6000)
	}
	checkMemvizExport(t, ctx, trace, j.pid)
	ag.stop(t)
}

// TestAttachHeldBefore: `record --pid` on a process that holds GPU memory
// allocated before the attach (attach_later's phase 1) reports the
// driver's figure for it (NVML's stand-in, listing the process with what
// the stand-in driver's log says it holds on each device), in JSON and in
// text; its frees of that memory are unknown frees, and the trace's
// memviz export lists only segments its entries refer to.
func TestAttachHeldBefore(t *testing.T) { attachHeldBefore(t, false) }

// TestAttachReaderBehind: the same, with the tracer's reader behind the
// process (here the tracer is stopped, by the test, from before phase 2
// until the process has exited and been reaped): its records are read
// when nothing of it is left in /proc, and its stacks are still named and
// its memory from before the trace still counted, from what the tracer
// read of it at the attach.
func TestAttachReaderBehind(t *testing.T) { attachHeldBefore(t, true) }

func attachHeldBefore(t *testing.T, readerBehind bool) {
	ctx, dir := traceSetup(t)
	log, trace, procs := filepath.Join(dir, "fake.log"), filepath.Join(dir, "before.trace"), filepath.Join(dir, "nvml.procs")
	p := startAttachLater(t, log)
	pid := p.cmd.Process.Pid
	before := onlyTruth(t, log, "") // phase 1: all there is in the log yet
	d0, d1 := before.Devices[0].Live, before.Devices[1].Live
	if d0 == 0 || d1 == 0 {
		t.Fatalf("phase 1 holds %d and %d bytes on devices 0 and 1, want some on each", d0, d1)
	}
	writeProcs(t, procs, pid, d0, d1)
	env := append(os.Environ(), "LD_LIBRARY_PATH="+fakeNVMLDir, "FAKENVML_PROCS="+procs)
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeLib, "--pid", strconv.Itoa(pid),
		"--nvml-interval", "50ms", "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	time.Sleep(300 * time.Millisecond) // NVML's first sample, before phase 2
	if readerBehind {
		if err := rec.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	p.proceed(t)
	if err := p.wait(t); err != nil { // reaped: /proc has no pid now
		t.Fatalf("attach_later: %v\n%s", err, p.stderr.String())
	}
	if readerBehind {
		if err := rec.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	rec.finish(t, 20*time.Second)
	if strings.Contains(rec.stderr.String(), "NVML unavailable") {
		t.Fatalf("NVML's stand-in was not loaded:\n%s", rec.stderr.String())
	}

	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Processes []struct {
			PID          int `json:"pid"`
			UnknownFrees int `json:"unknown_frees"`
			NVML         struct {
				HeldBefore int64 `json:"held_before_bytes"`
			} `json:"nvml"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Processes) != 1 || rep.Processes[0].PID != pid {
		t.Fatalf("processes %+v, want pid %d", rep.Processes, pid)
	}
	// attach_later frees a, c and m of phase 1 (and the host buffer h).
	if got := rep.Processes[0]; got.NVML.HeldBefore != int64(d0+d1) || got.UnknownFrees != 4 {
		t.Errorf("pid %d: held before %d bytes, %d unknown frees; want %d (NVML's figure at the attach) and 4",
			pid, got.NVML.HeldBefore, got.UnknownFrees, d0+d1)
	}
	text, err := exec.CommandContext(ctx, tracerBin, "report", trace).CombinedOutput()
	if err != nil {
		t.Fatalf("report: %v\n%s", err, text)
	}
	if want := fmt.Sprintf("Before tracing: pid %d held ", pid); !strings.Contains(string(text), want) {
		t.Errorf("report text has no %q:\n%s", want, text)
	}
	// Phase 2's stacks, in main and in the thread it starts.
	for _, fn := range []string{"main", "late_thread"} {
		if want := regexp.MustCompile(`#0 ` + fn + ` \([^)]*/attach_later\.c:\d+\) attach_later\n`); !want.Match(text) {
			t.Errorf("report text has no stack named %q:\n%s", want, text)
		}
	}
	checkMemvizExport(t, ctx, trace, pid)
}
