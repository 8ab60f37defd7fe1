package vmtest

// The NVML cross-check where there is no NVML to be had: NVIDIA's real
// libnvidia-ml (Debian non-free libnvidia-ml1) without a driver, and no
// library at all. One line says so, the trace records why, and tracing
// goes on.

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/memviztest"
)

const realLibNVML = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

// nvmlReport is what these tests read of `report --json`.
type nvmlReport struct {
	NVML *struct {
		Samples int    `json:"samples"`
		Failed  int    `json:"failed"`
		Error   string `json:"error"`
	} `json:"nvml"`
	Processes []struct {
		PID        int             `json:"pid"`
		Allocs     uint64          `json:"allocs"`
		AllocBytes uint64          `json:"alloc_bytes"`
		LiveBytes  uint64          `json:"live_bytes"`
		NVML       json.RawMessage `json:"nvml"`
	} `json:"processes"`
}

// recordMix records mix through argv (cudatrace record ... or a wrapper
// around it) and returns its stderr and report.
func recordMix(t *testing.T, dir string, argv ...string) (string, *nvmlReport) {
	t.Helper()
	ctx := testContext(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "nvml.trace")
	argv = append(argv, "--lib", fakeLib, "-q", "-o", trace, "--", workload("mix"), "1", "50", "3")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = fakeEnv(log)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, stderr.String())
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	var rep nvmlReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("report --json: %v", err)
	}
	want := onlyTruth(t, log, "")
	if len(rep.Processes) != 1 || rep.Processes[0].PID != want.PID || rep.Processes[0].Allocs != want.Allocs ||
		rep.Processes[0].AllocBytes != want.AllocBytes || rep.Processes[0].LiveBytes != want.Live {
		t.Errorf("traced %+v, want the truth %s", rep.Processes, want)
	}
	return stderr.String(), &rep
}

// checkUnavailable checks the one line on stderr and the report's record
// of why.
func checkUnavailable(t *testing.T, stderr string, rep *nvmlReport, why string) {
	t.Helper()
	line := "cudatrace: " + why + "; tracing goes on without the driver's figures"
	if n := strings.Count(stderr, "NVML unavailable"); n != 1 || !strings.Contains(stderr, line+"\n") {
		t.Errorf("stderr says NVML is unavailable %d times, want once, as %q:\n%s", n, line, stderr)
	}
	if rep.NVML == nil || rep.NVML.Error != why || rep.NVML.Samples != 0 || rep.NVML.Failed != 1 {
		t.Errorf("report nvml %+v, want error %q and no sample", rep.NVML, why)
	}
	if len(rep.Processes) == 1 && rep.Processes[0].NVML != nil {
		t.Errorf("process nvml %s with no sample", rep.Processes[0].NVML)
	}
}

func TestNVMLWithoutDriver(t *testing.T) {
	_, dir := traceSetup(t)
	if _, err := os.Stat(realLibNVML); err != nil {
		skipOrFail(t, "%s is missing (install Debian non-free libnvidia-ml1): %v", realLibNVML, err)
	}
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("an NVIDIA driver is loaded here: this test is for a host without one")
	}
	stderr, rep := recordMix(t, dir, tracerBin, "record")
	checkUnavailable(t, stderr, rep, "NVML unavailable: Driver Not Loaded")
}

// No libnvidia-ml at all: an empty tmpfs over its directory, in a mount
// namespace of the tracer's own. The binary starts, and says so.
func TestNVMLWithoutLibrary(t *testing.T) {
	_, dir := traceSetup(t)
	requireTool(t, "unshare")
	real, err := filepath.EvalSymlinks(realLibNVML)
	if err != nil {
		skipOrFail(t, "%s is missing (install Debian non-free libnvidia-ml1): %v", realLibNVML, err)
	}
	libDir := filepath.Dir(real)
	if _, err := os.Stat(filepath.Join(libDir, "libc.so.6")); err == nil {
		t.Fatalf("libnvidia-ml lives beside libc in %s: hiding the directory would hide libc", libDir)
	}
	if os.Getenv("LD_BIND_NOW") != "" {
		t.Fatal("LD_BIND_NOW is set: cudatrace binds NVML's functions lazily and would not start without the library")
	}
	// The binary must not be bound at start-up (-z now): go-nvml leaves
	// NVML's functions for the loader to bind on first call.
	f, err := elf.Open(tracerBin)
	if err != nil {
		t.Fatal(err)
	}
	flags, _ := f.DynValue(elf.DT_FLAGS)
	flags1, _ := f.DynValue(elf.DT_FLAGS_1)
	f.Close()
	for _, v := range flags {
		if v&uint64(elf.DF_BIND_NOW) != 0 {
			t.Errorf("%s has DF_BIND_NOW: it cannot start without libnvidia-ml", tracerBin)
		}
	}
	for _, v := range flags1 {
		if v&uint64(elf.DF_1_NOW) != 0 {
			t.Errorf("%s has DF_1_NOW: it cannot start without libnvidia-ml", tracerBin)
		}
	}
	hide := []string{"unshare", "-m", "sh", "-c", `mount -t tmpfs cudatrace-no-nvml "$0" && exec "$@"`, libDir}
	probe := exec.Command(hide[0], append(hide[1:], "ls", "-A", libDir)...)
	if out, err := probe.CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("hiding %s: %v, it lists %q", libDir, err, out)
	}
	start := time.Now()
	stderr, rep := recordMix(t, dir, append(hide, tracerBin, "record")...)
	checkUnavailable(t, stderr, rep, "NVML unavailable: library not found (libnvidia-ml.so.1)")
	t.Logf("recorded without libnvidia-ml in %v", time.Since(start).Round(time.Millisecond))
}

// --nvml=false: nothing said, nothing sampled.
func TestNVMLOff(t *testing.T) {
	_, dir := traceSetup(t)
	stderr, rep := recordMix(t, dir, tracerBin, "record", "--nvml=false")
	if strings.Contains(stderr, "NVML unavailable") || rep.NVML != nil {
		t.Errorf("--nvml=false: stderr %q, report nvml %+v", stderr, rep.NVML)
	}
}

// writeProcs sets what NVML's stand-in reports for pid on devices 0 and
// 1, atomically: a sample never reads half a file.
func writeProcs(t *testing.T, path string, pid int, used0, used1 uint64) {
	t.Helper()
	tmp := path + ".tmp"
	text := fmt.Sprintf("%d 0 %d\n%d 1 %d\n", pid, used0, pid, used1)
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestNVMLCrossCheck: record through go-nvml against NVML's stand-in
// while hold holds its memory; the driver's figure is the traced live
// bytes plus 300 MiB, then plus 400 MiB. The report puts the two side by
// side, to the byte, with the remainder's first, least, most and drift.
func TestNVMLCrossCheck(t *testing.T) {
	ctx, dir := traceSetup(t)
	h := startHold(t, filepath.Join(dir, "fake.log"))
	pid := h.cmd.Process.Pid
	procs, trace := filepath.Join(dir, "nvml.procs"), filepath.Join(dir, "cross.trace")
	env := append(os.Environ(), "LD_LIBRARY_PATH="+fakeNVMLDir, "FAKENVML_PROCS="+procs)
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--pid", strconv.Itoa(pid), "--lib", fakeLib,
		"--nvml-interval", "50ms", "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	want := h.hold(t)
	// A sample goes into the trace with the events read by then; the
	// reader polls every 50 ms. Let it read hold's before NVML lists hold.
	time.Sleep(300 * time.Millisecond)
	const mib = 1 << 20
	d0, d1 := want.Devices[0].Live, want.Devices[1].Live
	writeProcs(t, procs, pid, d0+200*mib, d1+100*mib)
	time.Sleep(500 * time.Millisecond)
	writeProcs(t, procs, pid, d0+250*mib, d1+150*mib)
	time.Sleep(500 * time.Millisecond)
	if err := os.Remove(procs); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	h.release(t)
	rec.finish(t, 30*time.Second)
	if strings.Contains(rec.stderr.String(), "NVML unavailable") {
		t.Fatalf("NVML's stand-in was not loaded:\n%s", rec.stderr.String())
	}

	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		NVML struct {
			Samples, Failed int
			Devices         []struct {
				Index        int    `json:"index"`
				UUID         string `json:"uuid"`
				Name         string `json:"name"`
				TotalBytes   uint64 `json:"total_bytes"`
				UsedBytes    uint64 `json:"used_bytes"`
				MaxUsedBytes uint64 `json:"max_used_bytes"`
			} `json:"devices"`
		} `json:"nvml"`
		Processes []struct {
			PID  int `json:"pid"`
			NVML struct {
				Samples        int    `json:"samples"`
				UsedBytes      uint64 `json:"used_bytes"`
				TracedBytes    uint64 `json:"traced_bytes"`
				RemainderBytes int64  `json:"remainder_bytes"`
				First          int64  `json:"first_remainder_bytes"`
				Min            int64  `json:"min_remainder_bytes"`
				Max            int64  `json:"max_remainder_bytes"`
				Drift          int64  `json:"drift_bytes"`
				MaxUsedBytes   uint64 `json:"max_used_bytes"`
				Devices        []struct {
					Device    int    `json:"device"`
					UUID      string `json:"uuid"`
					UsedBytes uint64 `json:"used_bytes"`
				} `json:"devices"`
			} `json:"nvml"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Processes) != 1 || rep.Processes[0].PID != pid {
		t.Fatalf("processes %+v, want pid %d", rep.Processes, pid)
	}
	p := rep.Processes[0].NVML
	if p.Samples < 2 || p.UsedBytes != want.Live+400*mib || p.TracedBytes != want.Live || p.RemainderBytes != 400*mib ||
		p.First != 300*mib || p.Min != 300*mib || p.Max != 400*mib || p.Drift != 100*mib || p.MaxUsedBytes != want.Live+400*mib {
		t.Errorf("pid %d's cross-check %+v; want used %d = traced %d + 400 MiB, the remainder first 300 MiB, drift 100 MiB",
			pid, p, want.Live+400*mib, want.Live)
	}
	if len(p.Devices) != 2 || p.Devices[0].UUID != "GPU-fake-0" || p.Devices[0].UsedBytes != d0+250*mib ||
		p.Devices[1].Device != 1 || p.Devices[1].UsedBytes != d1+150*mib {
		t.Errorf("per device %+v", p.Devices)
	}
	n := rep.NVML
	if n.Samples < 5 || n.Failed != 0 || len(n.Devices) != 2 {
		t.Fatalf("nvml %+v", n)
	}
	for i, d := range n.Devices {
		peak := []uint64{d0 + 250*mib, d1 + 150*mib}[i]
		if d.Index != i || d.UUID != fmt.Sprintf("GPU-fake-%d", i) || d.Name != "Fake NVML GPU" || d.TotalBytes != 16<<30 ||
			d.UsedBytes != 0 || d.MaxUsedBytes != peak {
			t.Errorf("device %d: %+v, want 16 GiB, 0 used at the end, %d at most", i, d, peak)
		}
	}

	text, err := exec.CommandContext(ctx, tracerBin, "report", trace).Output()
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s+hold\s+%s\s+%s\s+\+400\.0 MiB\s+\+300\.0 MiB\s+\+300\.0 MiB\s+\+400\.0 MiB\s+\+100\.0 MiB$`,
		pid, regexp.QuoteMeta(humanBytes(want.Live+400*mib)), regexp.QuoteMeta(humanBytes(want.Live))))
	if !row.Match(text) {
		t.Errorf("no cross-check row for pid %d in the text report:\n%s", pid, text)
	}
}

// TestMemvizOOMDeviceFree: where the trace has the driver's view (NVML's
// stand-in: 16 GiB per device, none used), every oom entry of the memviz
// export carries the device's free memory at the sample before it, not 0;
// the Allocator Settings tab says where the figure comes from.
func TestMemvizOOMDeviceFree(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "oom.trace")
	env := append(fakeEnv(log), "LD_LIBRARY_PATH="+fakeNVMLDir)
	// The command waits for the first samples before it allocates.
	rec := startRecord(t, ctx, recordOpts{Env: env}, "--lib", fakeLib, "--nvml-interval", "20ms", "-o", trace,
		"--", "sh", "-c", `sleep 0.5; exec "$0" 1 200 7`, workload("mix"))
	rec.finish(t, 50*time.Second)
	want := onlyTruth(t, log, "")
	if want.Failed == 0 {
		t.Fatalf("mix failed no allocation: no oom to check")
	}
	snap := filepath.Join(dir, "oom.pickle")
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "-f", "memviz", "--pid", strconv.Itoa(want.PID),
		"-o", snap).CombinedOutput(); err != nil {
		t.Fatalf("export memviz: %v\n%s", err, out)
	}
	sum := memviztest.Check(t, snap, memviztest.Want{DeviceKnown: true})
	if len(sum.DeviceFree) == 0 {
		t.Fatalf("no oom entry in the snapshot; the trace failed %d allocations", want.Failed)
	}
	for _, free := range sum.DeviceFree {
		if free != 16<<30 {
			t.Errorf("oom device_free %d, want %d (NVML's stand-in: 16 GiB, none used)", free, int64(16<<30))
		}
	}
	if src, _ := sum.Settings["device_free_source"].(string); !strings.HasPrefix(src, "nvml:") {
		t.Errorf("allocator_settings device_free_source %q, want it to name NVML", src)
	}
}
