package vmtest

// Tests of the stand-ins and of the ground-truth parser, without the tracer
// and without privileges: they make sure the tracer tests compare against a
// truth that is itself right.

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var cudaAPIs = []string{
	"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaMallocFromPoolAsync",
	"cudaMallocManaged", "cudaMallocPitch", "cudaMalloc3D", "cudaMallocHost", "cudaHostAlloc",
	"cudaFreeHost", "cudaSetDevice", "cudaGetDevice", "cudaGetLastError",
}

// cudaExports: what the runtime stand-in exports beside cudaAPIs (which
// the mix workload calls, each of them).
var cudaExports = []string{"cudaDeviceReset", "fakecuda_log_marker"}

// TestStandInELF checks the stand-in library is built like NVIDIA's: soname
// libcudart.so.12, every API exported and versioned libcudart.so.12, no frame
// pointers; and that the workloads are linked against it.
func TestStandInELF(t *testing.T) {
	needStandIns(t)
	f, err := elf.Open(fakeLib)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if soname, _ := f.DynString(elf.DT_SONAME); len(soname) != 1 || soname[0] != "libcudart.so.12" {
		t.Errorf("DT_SONAME = %q, want libcudart.so.12", soname)
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	bySym := map[string]elf.Symbol{}
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			bySym[s.Name] = s
		}
	}
	for _, api := range append(slices.Clone(cudaAPIs), cudaExports...) {
		s, ok := bySym[api]
		if !ok {
			t.Errorf("%s: not exported", api)
			continue
		}
		if s.Version != "libcudart.so.12" {
			t.Errorf("%s: version %q, want libcudart.so.12", api, s.Version)
		}
	}
	if len(bySym) != len(cudaAPIs)+len(cudaExports) {
		t.Errorf("exports %d functions, want the %d APIs and %v: %v", len(bySym), len(cudaAPIs), cudaExports, bySym)
	}
	// No frame pointer set-up at the entry of the probed functions.
	text := f.Section(".text")
	for _, api := range []string{"cudaMalloc", "cudaMalloc3D", "cudaMallocPitch", "cudaHostAlloc"} {
		s := bySym[api]
		code := make([]byte, 16)
		if _, err := text.ReadAt(code, int64(s.Value-text.Addr)); err != nil {
			t.Fatal(err)
		}
		code = bytes.TrimPrefix(code, []byte{0xf3, 0x0f, 0x1e, 0xfa}) // endbr64
		if bytes.HasPrefix(code, []byte{0x55, 0x48, 0x89, 0xe5}) {
			t.Errorf("%s starts with push %%rbp; mov %%rsp,%%rbp: built with frame pointers", api)
		}
	}

	for _, prog := range []string{"mix", "attach_later", "shortlived", "faketest"} {
		checkLinkedAgainst(t, workload(prog), "libcudart.so.12", fakeLibDir)
	}
	if realBuildErr == nil {
		checkLinkedAgainst(t, workload("realcuda"), "libcudart.so.11.0", "")
	}
}

func checkLinkedAgainst(t *testing.T, path, needed, runpath string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, _ := f.ImportedLibraries()
	var cudarts []string
	for _, l := range libs {
		if strings.HasPrefix(l, "libcudart") {
			cudarts = append(cudarts, l)
		}
	}
	if len(cudarts) != 1 || cudarts[0] != needed {
		t.Errorf("%s: DT_NEEDED libcudart entries %q, want [%s]", path, cudarts, needed)
	}
	if runpath == "" {
		return
	}
	rp, _ := f.DynString(elf.DT_RUNPATH)
	r, _ := f.DynString(elf.DT_RPATH)
	all := strings.Join(append(rp, r...), ":")
	if !strings.Contains(":"+all+":", ":"+runpath+":") {
		t.Errorf("%s: RUNPATH/RPATH %q lacks %s", path, all, runpath)
	}
}

// TestStandInLoaded checks that the stand-in, not NVIDIA's libcudart, is what
// a workload loads: with ldd, and in a running process's /proc/PID/maps.
func TestStandInLoaded(t *testing.T) {
	needStandIns(t)
	requireTool(t, "ldd")
	ctx := testContext(t)
	out, err := exec.CommandContext(ctx, "ldd", workload("mix")).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd: %v\n%s", err, out)
	}
	want := "libcudart.so.12 => " + fakeLib + " "
	if !strings.Contains(string(out), want) {
		t.Errorf("ldd %s does not show %q:\n%s", workload("mix"), want, out)
	}

	p := startAttachLater(t, "")
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	mapped := map[string]bool{}
	for _, line := range strings.Split(string(maps), "\n") {
		if i := strings.Index(line, "/"); i >= 0 && strings.Contains(line, "libcudart") {
			mapped[line[i:]] = true
		}
	}
	if len(mapped) != 1 || !mapped[fakeLib] {
		t.Errorf("attach_later maps libcudart from %v, want only %s", mapped, fakeLib)
	}
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Errorf("attach_later: %v\n%s", err, p.stderr.String())
	}
}

// TestStandInBehaviour runs testdata/faketest.c's checks of the stand-in
// (devices, alignment, reuse, limits, pitch, 3D, kinds, frees) and checks the
// log it leaves.
func TestStandInBehaviour(t *testing.T) {
	needStandIns(t)
	ctx := testContext(t)
	log := filepath.Join(t.TempDir(), "fake.log")
	cmd := exec.CommandContext(ctx, workload("faketest"))
	cmd.Env = fakeEnv(log, "FAKECUDA_MEM_LIMIT=1048576")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "faketest: ok") {
		t.Fatalf("faketest: %v\n%s", err, out)
	}
	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{ // a few lines, as they must appear, in order
		"cudaSetDevice ret=101 ptr=0x0 size=0 dev=2 kind=none req=0",
		"cudaMalloc ret=0 ptr=0x7e1000000000 size=1 dev=1 kind=device req=1",
		"cudaFree ret=1 ptr=0x7e1000000200 size=0 dev=1 kind=device req=0",
		"cudaMalloc ret=0 ptr=0x7e1000000200 size=600 dev=1 kind=device req=600",
		"cudaMalloc ret=1 ptr=0x0 size=0 dev=1 kind=device req=0",
		"cudaMalloc ret=2 ptr=0x0 size=0 dev=1 kind=device req=1048577",
		"cudaMallocAsync ret=0 ptr=0x7e0000000000 size=1048576 dev=0 kind=device req=1048576",
		"cudaFreeAsync ret=0 ptr=0x7e0000000000 size=1048576 dev=0 kind=device req=0",
		"cudaMallocPitch ret=0 ptr=0x7e1000000000 size=3072 dev=1 kind=device req=3000",
		"cudaMalloc3D ret=0 ptr=0x7e1000000c00 size=20480 dev=1 kind=device req=10260",
		"cudaMalloc3D ret=2 ptr=0x0 size=0 dev=1 kind=device req=2097152",
		"cudaMallocManaged ret=0 ptr=0x7d0000000000 size=100 dev=1 kind=managed req=100",
		"cudaHostAlloc ret=0 ptr=0x7c0000000200 size=100 dev=1 kind=host req=100",
		"cudaFree ret=1 ptr=0x7c0000000000 size=0 dev=1 kind=device req=0",
		"cudaFreeHost ret=0 ptr=0x7c0000000000 size=100 dev=1 kind=host req=0",
		"END_of_test ret=0 ptr=0x0 size=0 dev=1 kind=none req=0",
	}
	pid := calls[0].PID
	i := 0
	for _, c := range calls {
		if c.PID != pid {
			t.Fatalf("line %d: pid %d, want %d", c.Line, c.PID, pid)
		}
		got := fmt.Sprintf("%s ret=%d ptr=%#x size=%d dev=%d kind=%s req=%d", c.API, c.Ret, c.Ptr, c.Size, c.Dev, c.Kind, c.Req)
		if i < len(want) && got == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Errorf("log lacks (in order) %q; log:\n%s", want[i], readFileString(log))
	}
	truth, err := groundTruth(calls, "")
	if err != nil {
		t.Fatal(err)
	}
	p := truth[pid]
	if p.Live != 0 || p.HostLive != 0 || p.Allocs != p.Frees || p.LiveCount() != 0 {
		t.Errorf("faketest frees everything, truth says %v", p)
	}
	if p.Failed != 10 { // the failing allocation calls in faketest.c
		t.Errorf("failed = %d, want 10; failures: %v", p.Failed, p.Failures)
	}
	if p.Peak != 1<<20+1<<20 || p.Devices[1].Peak != 1<<20 || p.Devices[0].Peak != 1<<20 {
		t.Errorf("peaks: %v, want 2 MiB in all and 1 MiB per device", p)
	}
}

func readFileString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return truncate(string(b), 16<<10)
}

// mixTally is the line mix prints about itself at exit.
type mixTally struct {
	PID                               int
	Allocs, Frees, Failed, AllocBytes uint64
	Live, HostLive                    uint64
	DevLive                           map[int]uint64
	Bad                               int
}

var mixLineRE = regexp.MustCompile(`(?m)^mix: pid=(\d+) .*allocs=(\d+) frees=(\d+) failed=(\d+) alloc_bytes=(\d+) live_bytes=(\d+) host_live_bytes=(\d+) dev_live=(\S+) bad=(\d+)$`)

func parseMixTally(out string) (*mixTally, error) {
	m := mixLineRE.FindStringSubmatch(out)
	if m == nil {
		return nil, fmt.Errorf("no tally line in mix output:\n%s", out)
	}
	u := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }
	t := &mixTally{Allocs: u(m[2]), Frees: u(m[3]), Failed: u(m[4]), AllocBytes: u(m[5]), Live: u(m[6]),
		HostLive: u(m[7]), DevLive: map[int]uint64{}}
	t.PID, _ = strconv.Atoi(m[1])
	t.Bad, _ = strconv.Atoi(m[9])
	for _, kv := range strings.Split(m[8], ",") {
		d, v, _ := strings.Cut(kv, ":")
		n, _ := strconv.Atoi(d)
		t.DevLive[n] = u(v)
	}
	return t, nil
}

// runMix runs mix without the tracer and returns its tally.
func runMix(t *testing.T, log string, args ...string) *mixTally {
	t.Helper()
	ctx := testContext(t)
	cmd := exec.CommandContext(ctx, workload("mix"), args...)
	cmd.Env = fakeEnv(log)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mix %v: %v\n%s%s", args, err, out, stderr.String())
	}
	tally, err := parseMixTally(string(out))
	if err != nil {
		t.Fatal(err)
	}
	return tally
}

// TestGroundTruthMix runs mix without tracing and checks the parser's ground
// truth against mix's own tally and against itself.
func TestGroundTruthMix(t *testing.T) {
	needStandIns(t)
	log := filepath.Join(t.TempDir(), "fake.log")
	const threads = 4
	tally := runMix(t, log, strconv.Itoa(threads), "300", "7")
	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	truths, err := groundTruth(calls, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(truths) != 1 || truths[tally.PID] == nil {
		t.Fatalf("log has pids %v, want just mix's %d", keys(truths), tally.PID)
	}
	p := truths[tally.PID]
	t.Logf("truth: %v", p)

	// What the parser says equals what mix counted.
	check := func(name string, got, want uint64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: ground truth %d, mix counted %d", name, got, want)
		}
	}
	check("allocs", p.Allocs, tally.Allocs)
	check("frees", p.Frees, tally.Frees)
	check("failed", p.Failed, tally.Failed)
	check("alloc_bytes", p.AllocBytes, tally.AllocBytes)
	check("live_bytes", p.Live, tally.Live)
	check("host_live_bytes", p.HostLive, tally.HostLive)
	for d := 0; d < fakeDevices; d++ {
		var got uint64
		if p.Devices[d] != nil {
			got = p.Devices[d].Live
		}
		check(fmt.Sprintf("device %d live", d), got, tally.DevLive[d])
	}

	// Self-consistency.
	if uint64(p.LiveCount()) != p.Allocs-p.Frees {
		t.Errorf("live allocations %d != allocs %d - frees %d", p.LiveCount(), p.Allocs, p.Frees)
	}
	if p.AllocBytes-p.FreedBytes != p.Live+p.HostLive {
		t.Errorf("alloc_bytes %d - freed %d != live %d + host_live %d", p.AllocBytes, p.FreedBytes, p.Live, p.HostLive)
	}
	var devLive, devPeaks uint64
	for _, d := range p.Devices {
		devLive += d.Live
		devPeaks += d.Peak
		if d.Peak < d.Live {
			t.Errorf("a device's peak %d < its live %d", d.Peak, d.Live)
		}
	}
	if devLive != p.Live {
		t.Errorf("device lives add up to %d, live is %d", devLive, p.Live)
	}
	if p.Peak < p.Live || p.Peak > devPeaks {
		t.Errorf("peak %d outside [live %d, sum of device peaks %d]", p.Peak, p.Live, devPeaks)
	}
	if p.UnknownFrees != 0 {
		t.Errorf("%d frees of unknown allocations succeeded", p.UnknownFrees)
	}

	// The workload exercises what the tracer tests rely on.
	if r := float64(p.Frees) / float64(p.Allocs); r < 0.6 || r > 0.8 {
		t.Errorf("mix freed %.2f of its allocations, want about 0.7", r)
	}
	for _, api := range cudaAPIs {
		if p.APICalls[api] == 0 {
			t.Errorf("mix never called %s", api)
		}
	}
	codes := map[int]int{}
	for _, f := range p.Failures {
		codes[f.Ret]++
	}
	if codes[1] == 0 || codes[2] == 0 || len(codes) != 2 {
		t.Errorf("failed allocations by code %v, want some of 1 and of 2 only", codes)
	}
	if len(p.Threads) != threads+1 {
		t.Errorf("%d threads made calls, want %d", len(p.Threads), threads+1)
	}
	if len(p.Devices) != fakeDevices {
		t.Errorf("GPU memory on devices %v, want all %d", p.DeviceList(), fakeDevices)
	}
	seen := map[uint64]bool{}
	reused, invalidDev, nullFrees, badFrees := 0, 0, 0, 0
	for _, c := range calls {
		switch {
		case classOf(c.API) == classAlloc && c.Ret == 0:
			if seen[c.Ptr] {
				reused++
			}
			seen[c.Ptr] = true
		case c.API == "cudaSetDevice" && c.Ret == 101:
			invalidDev++
		case classOf(c.API) == classFree && c.Ptr == 0:
			nullFrees++
		case classOf(c.API) == classFree && c.Ret != 0:
			badFrees++
		}
	}
	if reused == 0 || invalidDev == 0 || nullFrees == 0 || badFrees == 0 {
		t.Errorf("reused addresses %d, invalid cudaSetDevice %d, frees of NULL %d, failed frees %d: want some of each",
			reused, invalidDev, nullFrees, badFrees)
	}
	if p.MaxAlloc > 33<<20 || p.MaxAlloc < 1<<20 {
		t.Errorf("largest allocation %d bytes, want tens of MiB", p.MaxAlloc)
	}
}

func keys[V any](m map[int]V) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// TestMixDeterministic: one thread with one seed makes the same calls, with
// the same results and addresses, every run.
func TestMixDeterministic(t *testing.T) {
	needStandIns(t)
	dir := t.TempDir()
	var logs [2][]string
	for i := range logs {
		log := filepath.Join(dir, fmt.Sprintf("fake%d.log", i))
		runMix(t, log, "1", "200", "3")
		calls, err := parseLogFile(log)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range calls {
			logs[i] = append(logs[i], fmt.Sprintf("%s ret=%d ptr=%#x size=%d dev=%d kind=%s req=%d", c.API, c.Ret, c.Ptr, c.Size, c.Dev, c.Kind, c.Req))
		}
	}
	if strings.Join(logs[0], "\n") != strings.Join(logs[1], "\n") {
		t.Errorf("two runs of mix 1 200 3 differ")
	}
	if len(logs[0]) < 200 {
		t.Errorf("%d calls, want at least 200", len(logs[0]))
	}
}

// attachLater is a running testdata/attach_later.
type attachLater struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *lockedBuffer
	done   chan error
}

// startAttachLater starts attach_later and waits for its "ready".
func startAttachLater(t *testing.T, log string) *attachLater {
	t.Helper()
	return startReady(t, log, "attach_later")
}

// startReady starts a workload that prints "ready" and waits for a line on
// stdin (attach_later, attach_ctx), and waits for its "ready".
func startReady(t *testing.T, log, name string, args ...string) *attachLater {
	t.Helper()
	ctx := testContext(t)
	cmd := exec.CommandContext(ctx, workload(name), args...)
	cmd.Env = fakeEnv(log)
	p := &attachLater{cmd: cmd, stderr: newLockedBuffer(""), done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("first line %q, want \"ready\"", line)
		}
		ready <- err
		io.Copy(io.Discard, stdout)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, p.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no \"ready\" in 20 s\n%s", name, p.stderr.String())
	}
	return p
}

// proceed sends the line that starts phase 2.
func (p *attachLater) proceed(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, "go\n"); err != nil {
		t.Fatalf("writing to attach_later: %v", err)
	}
	p.stdin.Close()
}

func (p *attachLater) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		return err
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		return fmt.Errorf("did not exit within 20 s of its go line")
	}
}

// TestGroundTruthPhase2 checks the marker logic against numbers worked out
// by hand from testdata/attach_later.c.
func TestGroundTruthPhase2(t *testing.T) {
	needStandIns(t)
	log := filepath.Join(t.TempDir(), "fake.log")
	p := startAttachLater(t, log)
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Fatalf("attach_later: %v\n%s", err, p.stderr.String())
	}
	truths, err := groundTruthFile(log, "PHASE2")
	if err != nil {
		t.Fatal(err)
	}
	pt := truths[p.cmd.Process.Pid]
	if len(truths) != 1 || pt == nil {
		t.Fatalf("truth for pids %v, want %d", keys(truths), p.cmd.Process.Pid)
	}
	const MiB = 1 << 20
	type want struct {
		allocs, frees, failed, unknownFrees, allocBytes, live, peak, hostLive uint64
		dev0Live, dev0Peak, dev1Live, dev1Peak                                uint64
	}
	w := want{
		allocs: 8, frees: 3, failed: 2, unknownFrees: 4,
		allocBytes: 4*MiB + 5*MiB + 1024*100 + 6*MiB + 128<<10 + 1*MiB + 2*MiB + 3000,
		live:       5*MiB + 1024*100 + 1*MiB + 2*MiB,
		peak:       5*MiB + 1024*100 + 6*MiB + 1*MiB + 2*MiB + 3000,
		hostLive:   128 << 10,
		dev0Live:   1*MiB + 2*MiB, dev0Peak: 6*MiB + 1*MiB + 2*MiB + 3000,
		dev1Live: 5*MiB + 1024*100, dev1Peak: 9 * MiB,
	}
	got := want{pt.Allocs, pt.Frees, pt.Failed, pt.UnknownFrees, pt.AllocBytes, pt.Live, pt.Peak, pt.HostLive,
		pt.Devices[0].Live, pt.Devices[0].Peak, pt.Devices[1].Live, pt.Devices[1].Peak}
	if got != w {
		t.Errorf("phase-2 truth\n got %+v\nwant %+v", got, w)
	}
	if k := pt.FailureKeys(); len(k) != 2 || k[failureKey("cudaMalloc", 1, 0, 0)] != 1 || k[failureKey("cudaMalloc", 2, 0, 1<<40)] != 1 {
		t.Errorf("failures %v", k)
	}
	all, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	if a := all[pt.PID]; a.Allocs != 8+5 || a.Frees != 3+5 || a.UnknownFrees != 0 {
		t.Errorf("whole-run truth: %v", a)
	}
}

// TestGroundTruthShortLived checks per-process truths of several processes
// sharing one log.
func TestGroundTruthShortLived(t *testing.T) {
	needStandIns(t)
	ctx := testContext(t)
	log := filepath.Join(t.TempDir(), "fake.log")
	var pids []int
	for range 3 {
		cmd := exec.CommandContext(ctx, workload("shortlived"))
		cmd.Env = fakeEnv(log)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("shortlived: %v\n%s", err, out)
		}
		pids = append(pids, cmd.Process.Pid)
	}
	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(truths) != 3 {
		t.Fatalf("truth for pids %v, want %v", keys(truths), pids)
	}
	for _, pid := range pids {
		p := truths[pid]
		if p == nil {
			t.Fatalf("no truth for pid %d", pid)
		}
		salt := uint64(pid%64) * 512
		b, m := 2<<20+salt, 3000+salt
		if p.Allocs != 4 || p.Frees != 2 || p.Failed != 1 || p.Live != b+m || p.HostLive != 0 ||
			p.Devices[1].Live != b+m || p.Devices[1].Peak != b+m || p.Devices[0].Peak != 1<<20+salt ||
			p.Peak != 1<<20+salt+b {
			t.Errorf("shortlived pid %d: %v", pid, p)
		}
	}
}

// realcudaResult is what realcuda printed: its pid and cudaMalloc's results.
type realcudaResult struct {
	PID     int
	Sizes   []uint64
	Results []int
}

var realcudaLineRE = regexp.MustCompile(`^cudaMalloc\((\d+)\) = (-?\d+)$`)

func parseRealcudaOutput(out string) (*realcudaResult, error) {
	r := &realcudaResult{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if v, ok := strings.CutPrefix(line, "pid="); ok {
			r.PID, _ = strconv.Atoi(v)
			continue
		}
		m := realcudaLineRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unexpected line %q", line)
		}
		size, _ := strconv.ParseUint(m[1], 10, 64)
		res, _ := strconv.Atoi(m[2])
		r.Sizes = append(r.Sizes, size)
		r.Results = append(r.Results, res)
	}
	if len(r.Results) != 3 {
		return nil, fmt.Errorf("%d results, want 3:\n%s", len(r.Results), out)
	}
	return r, nil
}

// TestRealcudaStandalone runs realcuda without the tracer: NVIDIA's
// cudaMalloc fails, without a GPU, with cudaErrorNoDevice.
func TestRealcudaStandalone(t *testing.T) {
	needRealCuda(t)
	ctx := testContext(t)
	outFile := filepath.Join(t.TempDir(), "realcuda.out")
	out, err := exec.CommandContext(ctx, workload("realcuda"), outFile).CombinedOutput()
	if err != nil {
		t.Fatalf("realcuda: %v\n%s", err, out)
	}
	r, err := parseRealcudaOutput(readFileString(outFile))
	if err != nil {
		t.Fatal(err)
	}
	if r.PID == 0 {
		t.Errorf("no pid line")
	}
	for i, res := range r.Results {
		if r.Sizes[i] != uint64(i+1)<<20 {
			t.Errorf("size %d, want %d", r.Sizes[i], (i+1)<<20)
		}
		if res == 0 {
			t.Errorf("cudaMalloc(%d) succeeded without a GPU", r.Sizes[i])
		} else if res != 100 {
			t.Logf("cudaMalloc(%d) = %d (%s), not 100: is libcuda.so.1 installed?", r.Sizes[i], res, cudaErrorNames[res])
		}
	}
}
