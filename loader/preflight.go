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
	capSysAdmin = 21
	capPerfmon  = 38
	capBPF      = 39
)

// Preflight checks what loading and attaching need, so that the user meets
// one clear sentence instead of a verifier or perf_event_open errno: the
// capabilities, BTF, and (ProbeKernel) every BPF helper the programs call.
func Preflight() error {
	caps, err := effectiveCaps()
	if err == nil && !hasCap(caps, capSysAdmin) && !(hasCap(caps, capBPF) && hasCap(caps, capPerfmon)) {
		return hint.Wrap(errors.New("cudatrace needs CAP_BPF and CAP_PERFMON (or root) to load its probes"),
			"run it with sudo, or grant the capabilities: sudo setcap cap_bpf,cap_perfmon+ep $(which cudatrace)")
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return hint.Wrap(errors.New("this kernel exposes no BTF (/sys/kernel/btf/vmlinux is missing)"),
			"cudatrace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distributions since 2021; Linux 5.15 or later)")
	}
	if err := features.HaveMapType(ebpf.RingBuf); err != nil {
		return hint.Wrap(fmt.Errorf("this kernel lacks BPF ring buffers: %w", err),
			"cudatrace needs Linux 5.15 or later")
	}
	if _, err := ProbeKernel(); err != nil {
		return err
	}
	return nil
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
