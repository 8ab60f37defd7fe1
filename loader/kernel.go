package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// MinKernel is the oldest Linux cudatrace loads on: uprobe attach cookies
// (bpf_get_attach_cookie), which tell one program the function it serves,
// came in 5.15.
const MinKernel = "5.15"

// Helper is a BPF helper the programs call and the Linux release that
// added it, for kprobe (and so uprobe) programs.
type Helper struct {
	Fn    asm.BuiltinFunc
	Since string
	// Optional helpers have a program variant that does without them;
	// every other one is needed.
	Optional bool
	What     string // what it gives, for the message below the floor
}

// Helpers lists every helper bpf/cudatrace.bpf.c (with its headers) calls (a unit test reads
// the compiled object and fails on one missing here), with the release
// that added it (include/uapi/linux/bpf.h's history).
var Helpers = concat(
	since("3.19", asm.FnMapLookupElem, asm.FnMapUpdateElem, asm.FnMapDeleteElem),
	since("4.2", asm.FnGetCurrentPidTgid),
	since("4.8", asm.FnGetCurrentTask),
	since("5.5", asm.FnProbeReadUser, asm.FnProbeReadKernel, asm.FnProbeReadUserStr, asm.FnProbeReadKernelStr),
	since("5.8", asm.FnKtimeGetBootNs, asm.FnRingbufOutput, asm.FnRingbufReserve, asm.FnRingbufSubmit, asm.FnRingbufDiscard, asm.FnRingbufQuery),
	[]Helper{
		{Fn: asm.FnGetAttachCookie, Since: "5.15", What: "uprobe attach cookies"},
		// The Python walk's loops; the *_noloop programs walk with
		// bounded loops instead (Linux 5.3).
		{Fn: asm.FnLoop, Since: "5.17", Optional: true},
		// The calling thread's task, read in place (its name:
		// bpf/common.h fill_event).
		{Fn: asm.FnGetCurrentTaskBtf, Since: "5.11"},
		{Fn: asm.FnFindVma, Since: "5.17", Optional: true},
	},
)

func concat(groups ...[]Helper) []Helper {
	var all []Helper
	for _, g := range groups {
		all = append(all, g...)
	}
	return all
}

// since lists needed helpers that came in one release.
func since(release string, fns ...asm.BuiltinFunc) []Helper {
	hs := make([]Helper, len(fns))
	for i, fn := range fns {
		hs[i] = Helper{Fn: fn, Since: release}
	}
	return hs
}

// Kernel is what the running kernel offers cudatrace.
type Kernel struct {
	Release string // uname -r
	// BPFLoop: bpf_loop (5.17) is there. Without it the programs that walk
	// Python frames load in their bounded-loop variant.
	BPFLoop bool
	// UprobeMulti: uprobe_multi links (6.6) are there. One link then
	// attaches a program to every function of a library that takes it;
	// without, each function gets a perf-event uprobe of its own.
	UprobeMulti bool
	// Memlock is the error of lifting RLIMIT_MEMLOCK, on kernels that still
	// charge BPF memory to it (before 5.11); nil where memory is accounted by
	// cgroup or the limit was lifted.
	Memlock error
}

// NoBPFLoopEnv, set to 1, makes cudatrace load the variant kernels without
// bpf_loop get (5.15, 5.16) on any kernel: for tests.
const NoBPFLoopEnv = "CUDATRACE_TEST_NO_BPF_LOOP"

// NoUprobeMultiEnv, set to 1, makes cudatrace attach one perf-event uprobe
// per function, as on kernels before 6.6, on any kernel: for tests.
const NoUprobeMultiEnv = "CUDATRACE_TEST_NO_UPROBE_MULTI"

var probeKernel = sync.OnceValues(func() (Kernel, error) {
	k := Kernel{Release: release()}
	// A no-op where the kernel accounts BPF memory by cgroup (5.11 on); on
	// older kernels maps and programs count against RLIMIT_MEMLOCK, whose
	// default is too small for the ring buffer.
	k.Memlock = rlimit.RemoveMemlock()
	if err := features.HaveProgramType(ebpf.Kprobe); err != nil {
		return k, fmt.Errorf("probe kprobe programs: %w", err)
	}
	for _, h := range Helpers {
		err := features.HaveProgramHelper(ebpf.Kprobe, h.Fn)
		switch {
		case err == nil:
			if h.Fn == asm.FnLoop {
				k.BPFLoop = true
			}
		case errors.Is(err, ebpf.ErrNotSupported) && h.Optional:
		case errors.Is(err, ebpf.ErrNotSupported):
			what := "BPF helper " + helperName(h.Fn)
			if h.What != "" {
				what = h.What + " (" + helperName(h.Fn) + ", Linux " + h.Since + ")"
			} else {
				what += " (Linux " + h.Since + ")"
			}
			return k, belowFloor(k.Release, what)
		default:
			return k, fmt.Errorf("probe BPF helper %s: %w", helperName(h.Fn), err)
		}
	}
	// ct_fork's BTF-typed tracepoint (5.5) has no probe of its own in
	// cilium/ebpf (a tracing program needs a target to load): it is older
	// than attach cookies, so the floor covers it.
	if os.Getenv(NoBPFLoopEnv) == "1" {
		k.BPFLoop = false
	}
	// Any error (ENOTSUPP, or a kernel that refuses the probe's program
	// for another reason) leaves the per-function uprobes, which every
	// kernel from the floor on takes.
	k.UprobeMulti = features.HaveBPFLinkUprobeMulti() == nil && os.Getenv(NoUprobeMultiEnv) != "1"
	return k, nil
})

// ProbeKernel checks that the running kernel has everything the BPF
// programs need and says which variants it takes. Below the floor the
// error is one line naming the kernel, what it lacks and the release
// needed. Probed once per process.
func ProbeKernel() (Kernel, error) { return probeKernel() }

func belowFloor(release, missing string) error {
	// One line, no hint: it says all there is to do.
	return fmt.Errorf("this kernel (Linux %s) lacks %s: cudatrace needs Linux %s or later", release, missing, MinKernel)
}

// helperName is the helper's C name, as the kernel's docs and verifier
// logs have it: FnGetAttachCookie is bpf_get_attach_cookie.
func helperName(fn asm.BuiltinFunc) string {
	name := strings.TrimPrefix(fn.String(), "Fn")
	var b strings.Builder
	b.WriteString("bpf")
	for _, r := range name {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func release() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "(unknown release)"
	}
	return unix.ByteSliceToString(u.Release[:])
}
