package vmtest

// The NVML cross-check where there is no NVML to be had: NVIDIA's real
// libnvidia-ml (Debian non-free libnvidia-ml1) without a driver, and no
// library at all. One line says so, the trace records why, and tracing
// goes on.

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
