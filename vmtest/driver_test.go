package vmtest

// The driver API (libcuda.so.1): the stand-in's cuMem* calls and contexts,
// and NVIDIA's real libcuda. Privileged.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDriver: a program that uses the driver alone, on two devices chosen
// through contexts (retained and made current, created, pushed, popped),
// with VMM memory created, mapped, released while mapped and unmapped. The
// ledger, devices included, matches the stand-in's ground truth exactly.
func TestDriver(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "driver.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeDriver, "-o", trace, "--", workload("driver"), "30")
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	if len(want.Devices) != 2 {
		t.Fatalf("the workload used devices %v, want 0 and 1", want.DeviceList())
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, peakSlack(want, 2), "driver")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	checkStacks(t, rep, want.PID, workload("driver"), "drv_alloc_device", "work", "thread1")
	checkStacks(t, rep, want.PID, workload("driver"), "drv_alloc_pinned", "work", "main")
	if n := len(rep.Failures); n == 0 || rep.Failures[0].Error != "CUDA_ERROR_OUT_OF_MEMORY" {
		t.Errorf("failures %+v, want CUDA_ERROR_OUT_OF_MEMORY", rep.Failures)
	}
	checkVMM(t, rep, want)
}

// checkVMM: the workload's vmm_mapped leaves two 2 MiB chunks of device 1
// mapped at the 4th and 6th slots of a 32 MiB reservation, the first of
// them released while mapped (held, as the driver holds it); the ground
// truth must say the same, and the report must list both mappings.
func checkVMM(t *testing.T, rep *report, want *procTruth) {
	t.Helper()
	const chunk = 2 << 20
	if want.Mapped != 2*chunk || want.Maps != 6 || want.Unmaps != 4 || want.Reserved != 16*chunk {
		t.Fatalf("ground truth: mapped %d, maps %d, unmaps %d, reserved %d; the workload should leave 2 chunks of 6 mapped in 16 reserved",
			want.Mapped, want.Maps, want.Unmaps, want.Reserved)
	}
	p := rep.process(want.PID)
	if p == nil || len(p.VMMMappings) != 2 {
		t.Fatalf("vmm_mappings of pid %d: %+v, want 2", want.PID, p)
	}
	m := p.VMMMappings
	if m[1].Addr-m[0].Addr != 2*chunk || m[0].Size != chunk || m[1].Size != chunk || m[0].Device != 1 ||
		m[1].Device != 1 || !m[0].Released || m[1].Released {
		t.Errorf("vmm_mappings %+v: want chunks 3 (released) and 5 (not) of device 1, 2 MiB each", m)
	}
}

// TestRealLibcuda: NVIDIA's libcuda.so.1 from Debian non-free exports what
// the driver table needs, and every probe attaches to it by symbol.
func TestRealLibcuda(t *testing.T) {
	ctx, dir := traceSetup(t)
	const real = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
	if _, err := os.Stat(real); err != nil {
		skipOrFail(t, "NVIDIA's libcuda.so.1 is not installed (apt-get install libcuda1 from non-free): %v", err)
	}
	trace := filepath.Join(dir, "t.trace")
	if out, err := exec.CommandContext(ctx, tracerBin, "record", "-q", "--lib", real, "-o", trace, "--", "true").CombinedOutput(); err != nil {
		t.Fatalf("record --lib %s: %v\n%s", real, err, out)
	}
	libs := reportLibraries(t, ctx, trace)
	if len(libs) != 1 {
		t.Fatalf("libraries %+v, want %s", libs, real)
	}
	for _, sym := range []string{"cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocPitch_v2", "cuMemAllocManaged",
		"cuMemAllocHost_v2", "cuMemHostAlloc", "cuMemFreeHost", "cuMemAllocAsync", "cuMemFreeAsync",
		"cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuMemCreate", "cuMemRelease",
		"cuMemMap", "cuMemUnmap", "cuMemAddressReserve", "cuMemAddressFree"} {
		if !slices.Contains(libs[0].Symbols, sym) {
			t.Errorf("%s not attached in %s: %v", sym, real, libs[0].Symbols)
		}
	}
}

// TestNestedRuntimeDriver: a runtime whose cudaMalloc and cudaFree reach the
// driver on the same thread. Each such call counts once, as the runtime's
// call from the application's stack; direct driver calls count on their
// own. The driver stand-in's log holds every allocation once.
func TestNestedRuntimeDriver(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "nested.trace")
	const iters = 20
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", nestRuntime, "--lib", fakeDriver, "-o", trace, "--", workload("nested"), "20")
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	if want.Allocs != 2*iters || want.Frees != iters {
		t.Fatalf("ground truth: %d allocs, %d frees; want %d and %d", want.Allocs, want.Frees, 2*iters, iters)
	}
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, 0, "nested")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	checkStacks(t, rep, want.PID, workload("nested"), "alloc_via_runtime", "main")
	checkStacks(t, rep, want.PID, workload("nested"), "alloc_via_driver", "main")

	// Which API each live allocation is attributed to: the runtime's
	// are 1000+i bytes, the driver's 5000+i.
	out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "json", "-o", "-").Output()
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Allocations []struct {
			API    string `json:"api"`
			Size   uint64 `json:"size"`
			Device int    `json:"device"`
		} `json:"allocations"`
		Counters map[string]uint64 `json:"counters"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	apis := map[string]int{}
	for _, a := range doc.Allocations {
		wantAPI := "cudaMalloc"
		if a.Size >= 5000 {
			wantAPI = "cuMemAlloc_v2"
		}
		if a.API != wantAPI || a.Device != 1 {
			t.Errorf("allocation of %d bytes: %s on device %d, want %s on device 1", a.Size, a.API, a.Device, wantAPI)
		}
		apis[a.API]++
	}
	if apis["cudaMalloc"] != iters/2 || apis["cuMemAlloc_v2"] != iters/2 {
		t.Errorf("live allocations by API %v, want %d of each", apis, iters/2)
	}
	// 20 driver allocations and 10 driver frees made inside runtime calls.
	if n := doc.Counters["nested"]; n != iters+iters/2 {
		t.Errorf("nested counter %d, want %d", n, iters+iters/2)
	}
}

// TestStaticRuntime: a program with the runtime linked in, launched without
// --lib: its own executable is found and probed.
func TestStaticRuntime(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "static.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "-o", trace, "--", workload("mix_static"), "2", "60", "5")
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, peakSlack(want, 2), "mix_static")
	// The stacks run through the executable's own (mix.c) functions.
	inExe := false
	for _, st := range rep.Stacks {
		for _, f := range st.Frames {
			inExe = inExe || (f.Function == "alloc_device_buffer" && f.Module == workload("mix_static"))
		}
	}
	if !inExe {
		t.Errorf("no stack through alloc_device_buffer in %s", workload("mix_static"))
	}

	libs := reportLibraries(t, ctx, trace)
	found := false
	for _, l := range libs {
		found = found || l.Library == workload("mix_static")
	}
	if !found {
		t.Errorf("the executable is not among the libraries probed: %+v", libs)
	}
}

// TestLibraryCopies: a symlink to a library is the same file and is probed
// once; a copy at another path is another file, probed on its own, and a
// process that loads the copy is traced through it.
func TestLibraryCopies(t *testing.T) {
	ctx, dir := traceSetup(t)
	copyLib := libCopy(t, filepath.Join(dir, "venv"))
	link := filepath.Join(dir, "libcudart-link.so.12")
	if err := os.Symlink(fakeLib, link); err != nil {
		t.Fatal(err)
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "copies.trace")
	// The workload's RUNPATH names the original; LD_LIBRARY_PATH comes first.
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, "LD_LIBRARY_PATH="+filepath.Dir(copyLib))},
		"--lib", fakeLib, "--lib", link, "--lib", copyLib, "-o", trace, "--", workload("mix"), "1", "40", "9")
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, peakSlack(want, 1), "mix")

	var got []string
	for _, l := range reportLibraries(t, ctx, trace) {
		got = append(got, l.Library)
	}
	if !slices.Equal(got, []string{fakeLib, copyLib}) {
		t.Errorf("libraries probed %q, want the original once and the copy", got)
	}
	maps, err := os.ReadFile(filepath.Join(dir, "copies.trace"))
	if err != nil || !strings.Contains(string(maps), copyLib) {
		t.Errorf("the trace does not show the copy mapped by the workload (%v)", err)
	}
}

// TestDlopenLate: a launched process dlopen()s a copy of the runtime, at a
// path no search covers, after tracing began. The tracer finds it in the
// process's mappings, attaches, says so, and traces what follows.
func TestDlopenLate(t *testing.T) {
	ctx, dir := traceSetup(t)
	lib := wheelCopy(t, filepath.Join(dir, "site-packages"))
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "late.trace")
	const n = 30
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeLib, "-o", trace, "--", workload("dlopen_late"), lib, "30")
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	if want.Allocs != n {
		t.Fatalf("ground truth has %d allocations, want %d", want.Allocs, n)
	}
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, 0, "dlopen_late")
	if !strings.Contains(rec.stderr.String(), "loaded "+lib+" after tracing began") {
		t.Errorf("record did not say it attached late:\n%s", rec.stderr.String())
	}

	libs := reportLibraries(t, ctx, trace)
	if len(libs) != 2 || libs[1].Library != lib || libs[1].LatePID != want.PID ||
		libs[1].LateNS < uint64(time.Second) || libs[1].EventsBefore != 0 {
		t.Errorf("libraries %+v: want %s attached late (after 1 s) for pid %d, after 0 events", libs, lib, want.PID)
	}
	text, err := exec.CommandContext(ctx, tracerBin, "report", trace).Output()
	if err != nil || !strings.Contains(string(text), "loaded "+lib+" after tracing began") {
		t.Errorf("the text report does not say the library came late (%v):\n%s", err, text)
	}
}

// reportLibrary is one library of `report --json`: what was probed, and
// when it was attached late, when and for whom.
type reportLibrary struct {
	Library      string   `json:"library"`
	Symbols      []string `json:"symbols"`
	LateNS       uint64   `json:"late_ns"`
	LatePID      int      `json:"late_pid"`
	LoadedNS     uint64   `json:"loaded_ns"`
	EventsBefore uint64   `json:"events_before"`
}

// reportLibraries runs `cudatrace report TRACE --json` and returns its
// libraries.
func reportLibraries(t *testing.T, ctx context.Context, trace string) []reportLibrary {
	t.Helper()
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatalf("cudatrace report %s --json: %v", trace, err)
	}
	var doc struct {
		Libraries []reportLibrary `json:"libraries"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Libraries
}

// wheelCopy copies the stand-in runtime where a pip wheel puts its own,
// under sitePackages: a second file, no start-up search covers.
func wheelCopy(t *testing.T, sitePackages string) string {
	t.Helper()
	return libCopy(t, filepath.Join(sitePackages, "nvidia", "cuda_runtime", "lib"))
}

// libCopy copies the stand-in runtime into dir (made if need be) as
// libcudart.so.12: the same bytes, another file.
func libCopy(t *testing.T, dir string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fakeLib)
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libcudart.so.12")
	if err := os.WriteFile(lib, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return lib
}

// TestDlopenLateSystemWide: with --all, a process started after the attach
// dlopen()s a copy of the runtime no start-up search covers. The tracer's
// scan of every process's mappings finds it and traces what follows.
func TestDlopenLateSystemWide(t *testing.T) {
	ctx, dir := traceSetup(t)
	lib := wheelCopy(t, filepath.Join(dir, "venv", "lib", "python3.12", "site-packages"))
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "all-late.trace")
	rec := startRecord(t, ctx, recordOpts{}, "--all", "--lib", fakeLib, "-o", trace)
	rec.waitAttached(t, 30*time.Second)

	cmd := exec.CommandContext(ctx, workload("dlopen_late"), lib, "30")
	// The --all scan runs every 2 s: give it two chances.
	cmd.Env = append(fakeEnv(log), "DLOPEN_LATE_WAIT_MS=4500")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("dlopen_late: %v\n%s", err, out)
	}
	if err := rec.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rec.finish(t, 20*time.Second)

	want := onlyTruth(t, log, "")
	if want.PID != cmd.Process.Pid || want.Allocs != 30 {
		t.Fatalf("ground truth: pid %d with %d allocations, want pid %d with 30", want.PID, want.Allocs, cmd.Process.Pid)
	}
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, 0, "dlopen_late")
	if !strings.Contains(rec.stderr.String(), "loaded "+lib+" after tracing began") {
		t.Errorf("record did not say it attached late:\n%s", rec.stderr.String())
	}
}

// TestMountNamespace: a process in a mount namespace of its own (as in a
// container) loads a runtime from a mount only it can see. The tracer
// reaches the file through /proc/PID/root and traces it.
func TestMountNamespace(t *testing.T) {
	ctx, dir := traceSetup(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		skipOrFail(t, "no unshare (util-linux): %v", err)
	}
	private := filepath.Join(dir, "private")
	if err := os.MkdirAll(private, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(private, "libcudart.so.12")
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "ns.trace")
	script := fmt.Sprintf("mount -t tmpfs none %s && cp %s %s && exec %s %s 20", private, fakeLib, lib,
		workload("dlopen_late"), lib)
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeLib, "-o", trace, "--", "unshare", "-m", "--propagation", "private", "sh", "-c", script)
	rec.finish(t, 45*time.Second)

	if _, err := os.Stat(lib); err == nil {
		t.Fatalf("%s is visible outside the namespace: the test proves nothing", lib)
	}
	want := onlyTruth(t, log, "")
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, 0, "dlopen_late")
	viaRoot := fmt.Sprintf("/proc/%d/root%s", want.PID, lib)
	if !strings.Contains(rec.stderr.String(), "loaded "+viaRoot+" after tracing began") {
		t.Errorf("record did not attach %s:\n%s", viaRoot, rec.stderr.String())
	}
}

// TestContextStack: the driver's context stack and the memory that dies
// with a context (ctxstack.c): create-create-pop, set-create-destroy, a
// detach of a context that was not current (PyCUDA's Context.detach), the
// address coming back after an implicit free, a primary context's last
// release. Devices, failures and implicit frees match the stand-in's
// ground truth exactly, and the memviz export of the trace succeeds (its
// segments would overlap if the implicitly freed memory stayed live).
func TestContextStack(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "ctx.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeDriver, "-o", trace, "--", workload("ctxstack"))
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	// The stand-in's own account: 1+4 MiB live on device 0; freed with
	// their contexts: 2 and 4 MiB (device 0), 3 and 5 MiB (device 1).
	const mib = 1 << 20
	if want.Live != 5*mib || want.ImplicitFrees != 4 || want.ImplicitFreeBytes != 14*mib ||
		want.Devices[0].ImplicitFreeBytes != 6*mib || want.Devices[1].ImplicitFreeBytes != 8*mib || want.Failed != 4 {
		t.Fatalf("ground truth: %v", want)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "ctxstack")
	checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	checkStacks(t, rep, want.PID, workload("ctxstack"), "ctx_alloc", "main")

	snap := filepath.Join(dir, "ctx.pickle")
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "memviz", "-o", snap).CombinedOutput(); err != nil {
		t.Fatalf("export --format memviz: %v\n%s", err, out)
	}
	// In the report's text, the implicit frees have a column of their own.
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace).CombinedOutput()
	if err != nil {
		t.Fatalf("report: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "IMPLICIT-FREED") || !strings.Contains(string(out), "4 (14.0 MiB)") {
		t.Errorf("report text has no IMPLICIT-FREED column with 4 (14.0 MiB):\n%s", out)
	}
}

// TestContextHandleShared: two processes hold the same context handle for
// contexts on different devices (ctxshare.c). Each one's allocations are
// on its own context's device, and one's destroy does not end the other's
// context: the child's 1 MiB stays live on device 1 at its exit, the
// parent's 2 MiB on device 0 is freed with its context; as the stand-in
// counts them.
func TestContextHandleShared(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "share.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)},
		"--lib", fakeDriver, "-o", trace, "--", workload("ctxshare"))
	rec.finish(t, 45*time.Second)

	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(truths) != 2 {
		t.Fatalf("ground truth has pids %v, want two", keys(truths))
	}
	const mib = 1 << 20
	var parent, child *procTruth
	for _, p := range truths {
		switch {
		case p.Live == mib && p.ImplicitFrees == 0 && p.Devices[1] != nil && p.Devices[0] == nil:
			child = p
		case p.Live == 0 && p.ImplicitFrees == 1 && p.Devices[0].ImplicitFreeBytes == 2*mib && p.Devices[1] == nil:
			parent = p
		}
	}
	if parent == nil || child == nil {
		t.Fatalf("ground truth: %v, want a parent that freed 2 MiB on device 0 with its context and a child with 1 MiB live on device 1", truths)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, parent, 0, "ctxshare")
	checkProcess(t, rep, child, 0, "ctxshare")
	checkNoOtherProcesses(t, rep, truths)
}

// TestAttachBeforeCUDA: `record --pid` on a process that has not loaded
// CUDA yet waits for it, saying so once, and traces what the process does
// once it dlopen()s a runtime, exactly (issue 17).
func TestAttachBeforeCUDA(t *testing.T) {
	ctx, dir := traceSetup(t)
	lib := wheelCopy(t, filepath.Join(dir, "site-packages"))
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "before.trace")
	// Loads the library 4 s after starting: the tracer is attached by then.
	cmd, rec := recordDlopenLate(t, ctx, trace, lib, append(fakeEnv(log), "DLOPEN_LATE_DELAY_MS=4000"))
	stderr := rec.stderr.String()
	waiting := fmt.Sprintf("cudatrace: pid %d has not loaded CUDA yet", cmd.Process.Pid)
	if n := strings.Count(stderr, waiting); n != 1 {
		t.Errorf("record said %q %d times, want once:\n%s", waiting, n, stderr)
	}
	if !strings.Contains(stderr, "loaded "+lib+" after tracing began: attached ") || !strings.Contains(stderr, " after it mapped it;") {
		t.Errorf("record did not say it attached late, after the process mapped it:\n%s", stderr)
	}
	// Attached when its loader said it mapped it (bpf/notify.h): the
	// report has when it was mapped, and when attached, after.
	libs := reportLibraries(t, ctx, trace)
	i := slices.IndexFunc(libs, func(l reportLibrary) bool { return l.Library == lib })
	if i < 0 || libs[i].LoadedNS == 0 || libs[i].LateNS < libs[i].LoadedNS {
		t.Errorf("libraries %+v: want %s with when it was mapped, at or before when it was attached", libs, lib)
	}
	want := onlyTruth(t, log, "")
	if want.PID != cmd.Process.Pid || want.Allocs != 30 {
		t.Fatalf("ground truth: pid %d with %d allocations, want pid %d with 30", want.PID, want.Allocs, cmd.Process.Pid)
	}
	rep := runReport(t, ctx, trace)
	checkProcess(t, rep, want, 0, "dlopen_late")
}

// TestLateLoadSearchPath: a --pid process with no CUDA loaded when
// tracing starts, which later loads the runtime by name from its
// LD_LIBRARY_PATH and allocates 2 ms after: every call is traced, since
// what it would load by name was attached when tracing started
// (loader.SearchPath). One that loads a copy by a path no search covers
// is attached when its loader says it mapped it, and the report says
// when it was mapped and attached, not how many calls came between.
func TestLateLoadSearchPath(t *testing.T) {
	ctx, dir := traceSetup(t)
	ldpath := filepath.Join(dir, "ldpath")
	if err := os.MkdirAll(ldpath, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fakeLib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ldpath, "libcudart.so.12"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "search.trace")
	cmd, rec := recordDlopenLate(t, ctx, trace, "libcudart.so.12",
		append(fakeEnv(log), "DLOPEN_LATE_DELAY_MS=3000", "DLOPEN_LATE_WAIT_MS=2", "LD_LIBRARY_PATH="+ldpath))
	want := onlyTruth(t, log, "")
	if want.PID != cmd.Process.Pid || want.Allocs != 30 {
		t.Fatalf("ground truth: pid %d with %d allocations, want pid %d with 30", want.PID, want.Allocs, cmd.Process.Pid)
	}
	checkProcess(t, runReport(t, ctx, trace), want, 0, "dlopen_late")
	if strings.Contains(rec.stderr.String(), "after tracing began") {
		t.Errorf("record attached the library late, where it was on the search path:\n%s", rec.stderr.String())
	}
}

// recordDlopenLate runs dlopen_late LIB 30 with env, record --pid of it
// writing trace, and waits for both to end well.
func recordDlopenLate(t *testing.T, ctx context.Context, trace, lib string, env []string) (*exec.Cmd, *recording) {
	t.Helper()
	cmd := exec.CommandContext(ctx, workload("dlopen_late"), lib, "30")
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	rec := startRecord(t, ctx, recordOpts{}, "--pid", fmt.Sprint(cmd.Process.Pid), "-o", trace)
	if err := <-done; err != nil {
		t.Fatalf("dlopen_late: %v\n%s", err, out.String())
	}
	if code := rec.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("record --pid exited %d, want 0:\n%s", code, rec.stderr.String())
	}
	return cmd, rec
}
