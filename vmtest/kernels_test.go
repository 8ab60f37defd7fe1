package vmtest

// The kernel matrix: cudatrace on the kernels GPU fleets run, booted under
// QEMU (TCG: no KVM needed) from Debian's kernel packages, which
// scripts/deps.sh fetches into a cache outside the checkout: x86-64's, and
// arm64's (Grace Hopper, Grace Blackwell) with the arm64 build of
// cudatrace and stand-ins (arm64_test.go). The guest, testdata/guest.sh as
// the initramfs's /init, records the stand-in workloads and sends back
// what it wrote; the checks run here, with the same ground-truth checkers
// as the tests on the host kernel.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// kernelCache is where scripts/deps.sh puts the kernels:
// kernels/<series>/vmlinuz and kernels/<series>/release.
func kernelCache() string {
	if d := os.Getenv("CUDATRACE_KERNEL_CACHE"); d != "" {
		return d
	}
	return "/var/cache/cudatrace-vmtest"
}

// The CPython the guest runs (pyenv's, with DWARF).
const guestPython = "3.11"

// guest is what one architecture's guests run, at the paths they have
// here: the workloads' directory, the CPython and the native function its
// ctypes calls reach the stand-in through (the nearest named frame below
// the Python ones).
type guest struct {
	arch   string // "amd64", "arm64"
	bin    string
	python string
	pyCall string
}

func (g guest) workload(name string) string { return filepath.Join(g.bin, name) }

// kernelRun is one boot of the matrix: its guest's initramfs, made once for
// every kernel of its architecture (lazily: the arm64 one cross-compiles
// while the x86-64 kernels boot), the kernel command line, and the checks
// of what it sent back.
type kernelRun struct {
	arch, series, cmdline string
	initrd                *initramfs
	check                 func(t *testing.T, out string, g guest)
}

// TestKernels boots each kernel of the matrix, all at once, and checks
// what cudatrace did there: on x86-64's 6.1 (Debian 12's, Amazon Linux
// 2023's) and 6.12 exact ledgers of the runtime mix at stack windows 0, 16
// and 64 KiB, --pid, the driver API with VMM, Python frames, the agent's
// /metrics and nothing left loaded; on 6.1 also the variant for kernels
// without bpf_loop (5.15, 5.16), its stacks unwound in BPF checked against
// the window's too; on 5.10, below the floor, one line
// refusing it. On arm64's 6.1 and 6.12 the same, with stand-ins that sign
// their return addresses (-mbranch-protection=standard) and Debian's arm64
// CPython 3.11, and besides: stacks through code without frame pointers
// exact to function and line (unwound there, and from the window on this
// host), and PyTorch's USDT tensor probes.
func TestKernels(t *testing.T) {
	needStandIns(t)
	needTracer(t)
	work := t.TempDir()
	if os.Getenv("VMTEST_KEEP") != "" {
		work = filepath.Join(buildDir, "kernels") // what each guest sent, kept with the build
	}
	amd64 := &initramfs{
		guest: func(t *testing.T) guest {
			for _, tool := range []string{"qemu-system-x86_64", "busybox", "cpio", "bpftool"} {
				requireTool(t, tool)
			}
			return guest{arch: "amd64", bin: binDir, python: pyenvPython(t, guestPython), pyCall: "_ctypes_callproc"}
		},
		make: func(g guest) (string, error) { return buildInitramfs(filepath.Join(work, "amd64"), g.python, nil, nil) },
	}
	arm64 := &initramfs{guest: arm64Guest, make: func(g guest) (string, error) {
		return buildInitramfsARM64(filepath.Join(work, "arm64"), g)
	}}
	full := func(noloop, multi bool) func(t *testing.T, out string, g guest) {
		return func(t *testing.T, out string, g guest) { checkFullKernel(t, out, g, noloop, multi) }
	}
	runs := []kernelRun{
		{"amd64", "6.1", "ct_mode=full ct_noloop=1", amd64, full(true, false)},
		{"amd64", "6.12", "ct_mode=full", amd64, full(false, true)},
		{"amd64", "5.10", "ct_mode=floor", amd64, func(t *testing.T, out string, _ guest) { checkFloorKernel(t, out) }},
		{"arm64", "6.1", "ct_mode=full" + arm64Dumps(), arm64, full(false, false)},
		{"arm64", "6.12", "ct_mode=full" + arm64Dumps(), arm64, full(false, true)},
	}
	for _, c := range runs {
		name := c.series
		if c.arch != "amd64" {
			name = c.arch + "-" + c.series
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			k := filepath.Join(kernelDir(c.arch, c.series), "vmlinuz")
			if _, err := os.Stat(k); err != nil {
				skipOrFail(t, "no %s Linux %s kernel (%v): scripts/deps.sh fetches it", c.arch, c.series, err)
			}
			initrd, g := c.initrd.get(t)
			out := filepath.Join(work, name)
			start := time.Now()
			err := bootKernel(c.arch, k, initrd, c.cmdline, out)
			if err != nil && strings.Contains(tail(filepath.Join(out, "console.log"), 64<<10), "Oops: int3") {
				// The stale-int3 oops of a static branch patched under TCG
				// (see bootKernel): logged, and booted once more. Any other
				// oops fails the test.
				t.Logf("Linux %s: the guest oopsed on an int3, booting it again: %v", c.series, err)
				if rerr := os.RemoveAll(out); rerr != nil {
					t.Fatal(rerr)
				}
				err = bootKernel(c.arch, k, initrd, c.cmdline, out)
			}
			if err != nil {
				t.Fatalf("%s Linux %s: %v", c.arch, c.series, err)
			}
			t.Logf("%s Linux %s booted and ran its cases in %v:\n%s", c.arch, c.series, time.Since(start).Round(time.Second),
				guestLines(filepath.Join(out, "console.log")))
			c.check(t, filepath.Join(out, "results"), g)
		})
	}
}

// initramfs is an architecture's guest root, made the first time a run
// asks for it; every run of its architecture gets the same one, or fails
// as the first did.
type initramfs struct {
	guest func(t *testing.T) guest // the guest's paths; skips (fails in CI) without what it needs
	make  func(g guest) (string, error)
	once  sync.Once
	path  string
	err   error
}

func (i *initramfs) get(t *testing.T) (string, guest) {
	t.Helper()
	g := i.guest(t)
	i.once.Do(func() { i.path, i.err = i.make(g) })
	if i.err != nil {
		t.Fatalf("%s initramfs: %v", g.arch, i.err)
	}
	return i.path, g
}

// kernelDir is where scripts/deps.sh put an architecture's kernel of a
// series.
func kernelDir(arch, series string) string {
	if arch == "arm64" {
		return filepath.Join(kernelCache(), "arm64", "kernels", series)
	}
	return filepath.Join(kernelCache(), "kernels", series)
}

// checkFullKernel checks a kernel that cudatrace supports; multi says
// whether it has uprobe_multi links (6.6 on), which cudatrace then uses.
func checkFullKernel(t *testing.T, out string, g guest, noloop, multi bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	mix := g.workload("mix")

	// recorded: the case exited 0, the truth of its one process, the report.
	recorded := func(t *testing.T, c string) (*procTruth, *report) {
		t.Helper()
		dir := filepath.Join(out, c)
		if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
			t.Fatalf("case %s: cudatrace exited %s:\n%s", c, rc, readTrim(t, filepath.Join(dir, "stderr")))
		}
		return onlyTruth(t, filepath.Join(dir, "fake.log"), ""), runReport(t, ctx, filepath.Join(dir, "trace"))
	}
	exact := func(t *testing.T, c string, threads int, comm string) (*procTruth, *report) {
		t.Helper()
		want, rep := recorded(t, c)
		if rep.LostEvents != 0 {
			t.Errorf("lost_events = %d, want 0", rep.LostEvents)
		}
		checkProcess(t, rep, want, peakSlack(want, threads), comm)
		checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
		return want, rep
	}
	mixStacks := func(t *testing.T, rep *report, pid int) {
		t.Helper()
		checkStacks(t, rep, pid, mix, "alloc_device_buffer", "worker_main")
		checkStacks(t, rep, pid, mix, "alloc_pinned_staging", "worker_main")
		checkStacks(t, rep, pid, mix, "alloc_device_buffer", "setup_context", "main")
	}
	loaded := func(t *testing.T, c, exit string) {
		t.Helper()
		progs := readTrim(t, filepath.Join(out, c, "progs.txt"))
		if !regexp.MustCompile(`name ` + exit + `\s`).MatchString(progs) {
			t.Errorf("case %s: bpftool prog show lists no %s while recording:\n%s", c, exit, progs)
		}
	}

	t.Run("mix", func(t *testing.T) {
		want, rep := exact(t, "mix16", 4, "mix")
		mixStacks(t, rep, want.PID)
		loaded(t, "mix16", "ct_exit")
		checkExited(t, ctx, filepath.Join(out, "mix16", "trace"), want.PID) // ct_proc_exit loaded and ran
		checkLinkKinds(t, filepath.Join(out, "mix16"), multi)
	})
	// mix0's stacks are the frame-pointer walk's alone: on arm64, through
	// return addresses the mix signed, which BPF strips.
	for _, c := range []string{"mix0", "mix64"} {
		t.Run(c, func(t *testing.T) {
			want, rep := exact(t, c, 2, "mix")
			mixStacks(t, rep, want.PID)
		})
	}
	// Stacks unwound in BPF, each the window's unwind of the same event;
	// uwmemo's one allocation site comes again and again, from the memo
	// too.
	uwbpf := func(t *testing.T, c string) {
		t.Helper()
		dir := filepath.Join(out, c)
		if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
			t.Fatalf("case %s: cudatrace exited %s:\n%s", c, rc, readTrim(t, filepath.Join(dir, "stderr")))
		}
		stderr := readTrim(t, filepath.Join(dir, "stderr"))
		n, differ := unwindCheck(t, stderr)
		if n(1) == 0 || n(3) != 0 || n(4) != 0 {
			t.Errorf("%d stacks unwound in BPF, %d differ from the window's, %d not checked; want some, none, none: %s", n(1), n(3), n(4), differ)
		}
		rep := runReport(t, ctx, filepath.Join(dir, "trace"))
		if rep.LostEvents != 0 {
			t.Errorf("lost_events = %d, want 0", rep.LostEvents)
		}
		if memo := rep.Counters["unwound_from_memo"]; memo == 0 || memo > n(1) {
			t.Errorf("%d stacks from the memo, want 1 to %d", memo, n(1))
		}
	}
	t.Run("uwbpf", func(t *testing.T) { uwbpf(t, "uwbpf") })
	t.Run("driver", func(t *testing.T) {
		want, rep := exact(t, "driver", 2, "driver")
		checkStacks(t, rep, want.PID, g.workload("driver"), "drv_alloc_device", "work", "thread1")
		checkVMM(t, rep, want)
	})
	t.Run("attach", func(t *testing.T) {
		dir := filepath.Join(out, "attach")
		if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
			t.Fatalf("record --pid exited %s:\n%s", rc, readTrim(t, filepath.Join(dir, "stderr")))
		}
		want := onlyTruth(t, filepath.Join(dir, "fake.log"), "PHASE2")
		rep := runReport(t, ctx, filepath.Join(dir, "trace"))
		if rep.LostEvents != 0 {
			t.Errorf("lost_events = %d, want 0", rep.LostEvents)
		}
		checkProcess(t, rep, want, 0, "attach_later")
		checkNoOtherProcesses(t, rep, map[int]*procTruth{want.PID: want})
	})
	t.Run("python", func(t *testing.T) {
		truth, rep := recorded(t, "python")
		checkPythonReport(t, guestPython, script, g.pyCall, rep, truth)
	})
	t.Run("agent", func(t *testing.T) { checkGuestAgent(t, filepath.Join(out, "agent")) })
	if noloop {
		// What kernels without bpf_loop load, forced: native stacks exact,
		// and the bounded-loop Python walk's frames exact too.
		t.Run("noloop", func(t *testing.T) {
			want, rep := exact(t, "noloop", 4, "mix")
			mixStacks(t, rep, want.PID)
			loaded(t, "noloop", "ct_exit_noloop")
		})
		t.Run("noloop_python", func(t *testing.T) {
			truth, rep := recorded(t, "noloop_python")
			checkPythonReport(t, guestPython, script, g.pyCall, rep, truth)
		})
		// Its unwinder in BPF, each stack checked against the window's.
		t.Run("noloop_uwbpf", func(t *testing.T) {
			uwbpf(t, "noloop_uwbpf")
			loaded(t, "noloop_uwbpf", "ct_exit_noloop")
		})
	}
	if g.arch == "arm64" {
		checkARM64Cases(t, ctx, out, g)
	}
	t.Run("nothing left", func(t *testing.T) {
		for _, f := range []string{"progs.txt", "links.txt"} {
			text := readTrim(t, filepath.Join(out, "after", f))
			if strings.Contains(text, "ct_") || strings.Contains(text, "uprobe") || strings.Contains(text, "type 12") {
				t.Errorf("after every case, bpftool %s shows cudatrace's:\n%s", strings.TrimSuffix(f, ".txt"), text)
			}
		}
	})
}

// checkLinkKinds: while recording, the probes were attached by
// uprobe_multi links where the kernel has them (a few: one per program),
// else by one perf-event link per probe, as many as record said it
// attached, and one more: the dynamic loader's notification point
// (loader/dlnotify.go). bpftool older than uprobe_multi names them "type 12".
// The probes on the guest's CPython 3.10 to 3.13 code_dealloc
// (ct_code_free, one per interpreter file: Debian 12's python3.11) are
// not among those record counts.
func checkLinkKinds(t *testing.T, dir string, multi bool) {
	t.Helper()
	links := readTrim(t, filepath.Join(dir, "links.txt"))
	if m := regexp.MustCompile(`(?m)^(\d+): \w+\s+name ct_code_free\s`).FindStringSubmatch(readTrim(t, filepath.Join(dir, "progs.txt"))); m != nil {
		links = regexp.MustCompile(`(?m)^\d+: \w+\s+prog `+m[1]+`\s*$`).ReplaceAllString(links, "")
	}
	nMulti := len(regexp.MustCompile(`(?m)^\d+: (uprobe_multi|type 12) `).FindAllString(links, -1))
	nPerf := len(regexp.MustCompile(`(?m)^\d+: perf_event `).FindAllString(links, -1))
	m := regexp.MustCompile(`attached (\d+) probes`).FindStringSubmatch(readTrim(t, filepath.Join(dir, "stderr")))
	if m == nil {
		t.Fatalf("record did not say how many probes it attached")
	}
	probes, _ := strconv.Atoi(m[1])
	switch {
	case multi && (nPerf != 0 || nMulti == 0 || nMulti >= probes):
		t.Errorf("%d probes attached by %d uprobe_multi and %d perf-event links, want a few uprobe_multi links and no perf-event one:\n%s",
			probes, nMulti, nPerf, links)
	case !multi && (nMulti != 0 || nPerf != probes+1):
		t.Errorf("%d probes attached by %d uprobe_multi and %d perf-event links, want one perf-event link each and the loader's:\n%s",
			probes, nMulti, nPerf, links)
	}
}

// checkGuestAgent: the agent's /metrics, read while hold held its memory,
// gives each device's live bytes of the process as the ground truth has
// them at that moment.
func checkGuestAgent(t *testing.T, dir string) {
	metrics := readTrim(t, filepath.Join(dir, "metrics.txt"))
	pid := readTrim(t, filepath.Join(dir, "pid"))
	want := onlyTruth(t, filepath.Join(dir, "held.log"), "HOLD")
	if strconv.Itoa(want.PID) != pid {
		t.Fatalf("ground truth of pid %d, the workload was %s", want.PID, pid)
	}
	re := regexp.MustCompile(`^cudatrace_live_bytes\{(.*)\} (\S+)$`)
	got := map[int]uint64{}
	for _, line := range strings.Split(metrics, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[1], `pid="`+pid+`"`) || !strings.Contains(m[1], `level="segment"`) {
			continue
		}
		g := regexp.MustCompile(`gpu="(\d+)"`).FindStringSubmatch(m[1])
		if g == nil {
			continue
		}
		d, _ := strconv.Atoi(g[1])
		v, err := strconv.ParseFloat(m[2], 64) // the exposition writes 6.022169e+06
		if err != nil {
			t.Fatalf("/metrics line %q: %v", line, err)
		}
		got[d] = uint64(v)
	}
	for d, dt := range want.Devices {
		if got[d] != dt.Live {
			t.Errorf("cudatrace_live_bytes of pid %s on gpu %d = %d, want %d", pid, d, got[d], dt.Live)
		}
	}
	if len(got) != len(want.Devices) {
		t.Errorf("live bytes on gpus %v, want %d devices; /metrics:\n%s", got, len(want.Devices), truncate(metrics, 4<<10))
	}
	if rc := readTrim(t, filepath.Join(dir, "rc")); rc != "0" {
		t.Errorf("agent exited %s on SIGTERM:\n%s", rc, readTrim(t, filepath.Join(dir, "stderr")))
	}
}

// checkFloorKernel: below 5.15 the refusal is one line naming the
// running kernel, what it lacks and the release needed; no memlock
// advice, no verifier log.
func checkFloorKernel(t *testing.T, out string) {
	release := readTrim(t, filepath.Join(out, "uname"))
	dir := filepath.Join(out, "floor")
	if rc := readTrim(t, filepath.Join(dir, "rc")); rc == "0" {
		t.Fatalf("cudatrace record succeeded on Linux %s", release)
	}
	stderr := readTrim(t, filepath.Join(dir, "stderr"))
	want := fmt.Sprintf("cudatrace: this kernel (Linux %s) lacks uprobe attach cookies (bpf_get_attach_cookie, Linux 5.15): cudatrace needs Linux 5.15 or later", release)
	if stderr != want {
		t.Errorf("stderr on Linux %s:\n%s\nwant the one line:\n%s", release, stderr, want)
	}
}

func readTrim(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the guest left no %s: %v", path, err)
	}
	return strings.TrimSpace(string(b))
}

// bootKernel boots vmlinuz with initrd under QEMU for arch and unpacks
// what the guest sends to out/results; the console goes to
// out/console.log.
func bootKernel(arch, vmlinuz, initrd, cmdline, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	console, data := filepath.Join(out, "console.log"), filepath.Join(out, "data.b64")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var cmd *exec.Cmd
	switch arch {
	case "arm64":
		// The virt machine has one serial port: the results come over the
		// console, which loglevel=1 keeps to the guest's own lines (the
		// guest sends dmesg with its results). -cpu max implements pointer
		// authentication; pauth-impdef=on keeps it with QEMU's cheaper
		// algorithm, 3-4x faster to boot than the architected one
		// (docs/DESIGN's measurements). One thread per vCPU.
		data = console
		cmd = exec.CommandContext(ctx, "qemu-system-aarch64", "-machine", "virt", "-cpu", "max,pauth-impdef=on",
			"-smp", "2", "-m", "2G", "-nographic", "-no-reboot", "-monitor", "none",
			"-serial", "file:"+console,
			"-kernel", vmlinuz, "-initrd", initrd,
			"-append", "console=ttyAMA0 panic=-1 loglevel=1 "+cmdline)
	default:
		// -nographic with both serial ports given: ttyS0 the console, ttyS1
		// the results. panic=-1 and -no-reboot end QEMU on a guest panic.
		// thread=single: one host thread runs both vCPUs. With a thread per
		// vCPU (MTTCG) a 6.12 guest once hit a stale int3 while the kernel
		// patched a static branch (Oops: int3 in secure_tcp_seq_and_ts_off,
		// from wget), QEMU's cross-modifying code racing the patching.
		cmd = exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "q35", "-accel", "tcg,thread=single", "-cpu", "max",
			"-smp", "2", "-m", "2G", "-nographic", "-no-reboot", "-monitor", "none",
			"-serial", "file:"+console, "-serial", "file:"+data,
			"-kernel", vmlinuz, "-initrd", initrd,
			"-append", "console=ttyS0 panic=-1 loglevel=4 "+cmdline)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v\n%s\nconsole:\n%s", cmd, err, b, tail(console, 4<<10))
	}
	raw, err := os.ReadFile(data)
	if err != nil {
		return err
	}
	text := strings.ReplaceAll(string(raw), "\r", "")
	begin, end := strings.Index(text, "BEGIN-RESULTS\n"), strings.Index(text, "END-RESULTS")
	if begin < 0 || end < begin {
		return fmt.Errorf("the guest sent no results; console:\n%s", tail(console, 8<<10))
	}
	b64 := strings.ReplaceAll(text[begin+len("BEGIN-RESULTS\n"):end], "\n", "")
	tgz, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return fmt.Errorf("results: %v", err)
	}
	return untar(tgz, filepath.Join(out, "results"))
}

// guestLines are the console's lines from guest.sh: each case's start,
// with the guest's uptime.
func guestLines(console string) string {
	b, _ := os.ReadFile(console)
	var lines []string
	for _, l := range strings.Split(strings.ReplaceAll(string(b), "\r", ""), "\n") {
		if strings.HasPrefix(l, "guest: ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	return truncate(string(b), n)
}

func untar(tgz []byte, dir string) error {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(dir, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			if err := os.WriteFile(name, b, 0o644); err != nil {
				return err
			}
		}
	}
}

// buildInitramfs makes the x86-64 guest's root: busybox, guest.sh as
// /init, cudatrace and bpftool with the libraries they link, the stand-ins
// and workloads at the paths they have here (their build IDs and paths
// then name the same files on both sides), pythread.so, and pyenv's
// CPython with its standard library (less its tests and tools); and extra,
// more files at their paths here (programs with the libraries they link),
// with env added to /vm/env (the soak's, soak_test.go).
func buildInitramfs(work, python string, extra []string, env map[string]string) (string, error) {
	threads := filepath.Join(buildDir, "kernels", "pythread.so")
	if err := os.MkdirAll(filepath.Dir(threads), 0o755); err != nil {
		return "", err
	}
	if err := gcc("-shared", "-fPIC", "-O2", "-Wall", "-o", threads, filepath.Join("testdata", "pythread.c"), fakeLib); err != nil {
		return "", err
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return "", err
	}
	bpftool, err := exec.LookPath("bpftool")
	if err != nil {
		return "", err
	}
	prefix := filepath.Dir(filepath.Dir(python)) // .../versions/3.11.x
	pylib := filepath.Join(prefix, "lib", "python"+guestPython)
	r := guestRoot{
		files: map[string]string{
			busybox:   "/bin/busybox",
			tracerBin: "/usr/bin/cudatrace",
			bpftool:   "/usr/sbin/bpftool",
			threads:   threads,
			python:    python,
		},
		trees:  map[string]string{fakeLibDir: fakeLibDir, binDir: binDir},
		stdlib: pylib,
		env: map[string]string{"ARCH": "amd64", "LIB": fakeLib, "DRV": fakeDriver, "BIN": binDir, "PY": python,
			"THREADS": threads, "LIBPATH": "/lib/x86_64-linux-gnu", "RESULTS": "/dev/ttyS1"},
	}
	maps.Copy(r.env, env)
	for _, f := range extra {
		r.files[f] = f
	}
	// The shared libraries every binary links, as ldd finds them here.
	elfs := append([]string{tracerBin, bpftool, python}, extra...)
	dyn, _ := filepath.Glob(filepath.Join(pylib, "lib-dynload", "*.so"))
	elfs = append(elfs, dyn...)
	for _, e := range elfs {
		out, err := exec.Command("ldd", e).Output()
		if err != nil {
			continue // static
		}
		for _, line := range strings.Split(string(out), "\n") {
			for _, f := range strings.Fields(line) {
				if strings.HasPrefix(f, "/") {
					r.files[f] = f
				}
			}
		}
	}
	return writeInitramfs(work, r)
}

// guestRoot is what a guest's root holds besides guest.sh (its /init) and
// the Python script it runs: files and directory trees by their paths here
// (mapped to their paths there), symbolic links (by their paths there), a
// CPython standard library copied to the same path less its tests and
// tools, and /vm/env's variables (CT is cudatrace's path there, SCRIPT the
// script's).
type guestRoot struct {
	files  map[string]string
	trees  map[string]string
	links  map[string]string
	stdlib string
	env    map[string]string
}

// writeInitramfs makes r into work/initramfs.cpio, from work/root.
func writeInitramfs(work string, r guestRoot) (string, error) {
	root := filepath.Join(work, "root")
	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	guestSh, _ := filepath.Abs(filepath.Join("testdata", "guest.sh"))
	files := map[string]string{guestSh: "/init", script: script}
	maps.Copy(files, r.files)
	for src, dst := range files {
		if err := copyFile(src, filepath.Join(root, dst)); err != nil {
			return "", err
		}
	}
	if err := os.Chmod(filepath.Join(root, "init"), 0o755); err != nil {
		return "", err
	}
	for src, dst := range r.trees {
		if err := copyTree(src, filepath.Join(root, dst), nil); err != nil {
			return "", err
		}
	}
	for link, target := range r.links {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, link)), 0o755); err != nil {
			return "", err
		}
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return "", err
		}
	}
	skip := map[string]bool{"test": true, "idlelib": true, "tkinter": true, "turtledemo": true, "ensurepip": true,
		"lib2to3": true, "site-packages": true, "dist-packages": true, "pydoc_data": true, "unittest": true}
	if err := copyTree(r.stdlib, filepath.Join(root, r.stdlib), func(rel string, dir bool) bool {
		if dir {
			return skip[rel]
		}
		// Source and the plain bytecode only: no optimized .pyc.
		return strings.Contains(rel, ".opt-")
	}); err != nil {
		return "", err
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "root", "vm", "usr/bin", "usr/sbin"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return "", err
		}
	}
	env := map[string]string{"CT": "/usr/bin/cudatrace", "SCRIPT": script}
	maps.Copy(env, r.env)
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		lines = append(lines, k+"="+env[k]+"\n")
	}
	if err := os.WriteFile(filepath.Join(root, "vm", "env"), []byte(strings.Join(lines, "")), 0o644); err != nil {
		return "", err
	}
	initrd := filepath.Join(work, "initramfs.cpio")
	cmd := exec.Command("sh", "-c", "find . -print0 | cpio --null -o -H newc --quiet > "+initrd)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cpio: %v\n%s", err, b)
	}
	return initrd, nil
}

func copyFile(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	// The modification time too, which the initramfs keeps: CPython's
	// cached bytecode is valid only beside sources of the time it records
	// (else each import compiles its module again, seconds under TCG).
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// copyTree copies regular files and symlinks under src to dst; skip says
// what to leave out, by path relative to src.
func copyTree(src, dst string, skip func(rel string, dir bool) bool) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if skip != nil && rel != "." && skip(rel, d.IsDir()) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case d.Type()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, target)
		case d.Type().IsRegular():
			return copyFile(p, target)
		}
		return nil
	})
}

// TestNoBPFLoopVariant: on the host kernel, the programs kernels without
// bpf_loop (5.15, 5.16) load, forced by the loader's test switch: they are
// the ones loaded, the mix's ledger and native stacks are exact, and so are
// CPython's frames from the bounded-loop walk.
func TestNoBPFLoopVariant(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "bpftool")
	const force = "CUDATRACE_TEST_NO_BPF_LOOP=1"
	log, trace, progs := filepath.Join(dir, "fake.log"), filepath.Join(dir, "mix.trace"), filepath.Join(dir, "progs.txt")
	const threads = 4
	// libc10_cuda's USDT probes make it load ct_usdt (on first use).
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, force)}, "--lib", fakeLib, "--lib", c10Lib, "-o", trace, "--",
		"sh", "-c", fmt.Sprintf("bpftool prog show > %s; exec %s %d 300 7", progs, workload("mix"), threads))
	rec.finish(t, 50*time.Second)
	b, err := os.ReadFile(progs)
	if err != nil {
		t.Fatal(err)
	}
	// The tracer's own programs: others' tracers may run beside it.
	if !regexp.MustCompile(`name ct_exit_noloop\s`).Match(b) || !regexp.MustCompile(`name ct_usdt_noloop\s`).Match(b) {
		t.Errorf("bpftool prog show lists no ct_exit_noloop and ct_usdt_noloop while recording:\n%s", b)
	}
	checkMixTrace(t, ctx, log, trace, threads)

	script, _ := filepath.Abs(filepath.Join("testdata", "pyframes.py"))
	threadsLib := filepath.Join(dir, "pythread.so")
	if err := gcc("-shared", "-fPIC", "-O2", "-Wall", "-o", threadsLib, filepath.Join("testdata", "pythread.c"), fakeLib); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"3.10", "3.12"} {
		t.Run("python"+v, func(t *testing.T) {
			checkPythonFrames(t, v, pyenvPython(t, v), []string{force}, script, threadsLib, "_ctypes_callproc")
		})
	}
}
