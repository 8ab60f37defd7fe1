package loader

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"

	"github.com/cudatrace/cudatrace/internal/hint"
)

// Capability bits (linux/capability.h).
const (
	capSysPtrace = 19
	capSysAdmin  = 21
	capPerfmon   = 38
	capBPF       = 39
)

// initPIDNamespace is the inode of the kernel's initial PID namespace
// (PROC_PID_INIT_INO, include/linux/proc_ns.h): the host's.
const initPIDNamespace = "pid:[4026531836]"

// Preflight checks what loading and attaching need, so that the user meets
// one clear sentence instead of a verifier or perf_event_open errno: the
// host's PID namespace, the capabilities, BTF, and (ProbeKernel) every BPF
// helper the programs call. What tracing can do without (CAP_SYS_PTRACE,
// for other users' processes) comes back as a warning: one line saying
// what is missing and what that costs.
//
// The capabilities are exactly those the agent ships with
// (deploy/kubernetes/daemonset.yaml, deploy/systemd): CAP_BPF to load the
// programs and maps, CAP_PERFMON to attach uprobes and read user memory
// from them, CAP_SYS_PTRACE to read other users' processes (their
// mappings, their files through /proc/PID/root, their memory with
// process_vm_readv). Nothing is opened that needs CAP_DAC_OVERRIDE, and
// no process is signalled (CAP_KILL).
func Preflight() (warning string, err error) {
	if err := CheckPIDNamespace(); err != nil {
		return "", err
	}
	caps, err := effectiveCaps()
	if err == nil && !hasCap(caps, capSysAdmin) && !(hasCap(caps, capBPF) && hasCap(caps, capPerfmon)) {
		return "", hint.Wrap(errors.New("cudatrace needs CAP_BPF and CAP_PERFMON (or root) to load its probes"),
			"run it with sudo, or grant the capabilities: sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(which cudatrace)")
	}
	if err == nil && !hasCap(caps, capSysPtrace) {
		warning = "no CAP_SYS_PTRACE: processes of other users are traced, but their mappings, files and memory cannot be read " +
			"(their stacks stay addresses, their Python frames and job identity are left out); grant it, as the agent's manifests do"
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return warning, hint.Wrap(errors.New("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)"),
			"cudatrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distributions since 2021; Linux 5.15 or later)")
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return warning, hint.Wrap(fmt.Errorf("this kernel lacks BPF ring buffers: %w", err),
			"cudatrace needs Linux 5.15 or later")
	}
	if _, err := ProbeKernel(); err != nil {
		return warning, err
	}
	return warning, nil
}

// CheckPIDNamespace refuses, in one line that says what to set, to trace
// from a PID namespace other than the host's (a container without the
// host's PIDs): the PIDs BPF reports are the host's, which the tracer
// would take for its own namespace's, naming other processes, or none.
func CheckPIDNamespace() error {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil || ns == initPIDNamespace {
		return nil
	}
	return hint.Wrap(fmt.Errorf("this process is in a PID namespace of its own (%s), not the host's: the PIDs the probes report are the host's, which it does not see", ns),
		"run cudatrace in the host's PID namespace: hostPID: true in a Kubernetes pod, --pid=host with docker or podman")
}

func hasCap(caps uint64, bit uint) bool { return caps&(1<<bit) != 0 }

func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no CapEff in /proc/self/status")
}
