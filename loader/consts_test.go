package loader

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf/asm"

	"github.com/cudatrace/cudatrace/bpf"
)

// TestCounterNames: every counter of enum ct_counter has one name.
func TestCounterNames(t *testing.T) {
	if len(CounterNames) != int(bpf.CudatraceCtCounterCT_CNT_MAX) {
		t.Fatalf("%d counter names, enum ct_counter has %d counters", len(CounterNames), bpf.CudatraceCtCounterCT_CNT_MAX)
	}
	seen := map[string]bool{}
	for i, n := range CounterNames {
		if n == "" || seen[n] {
			t.Errorf("counter %d: name %q (empty or repeated)", i, n)
		}
		seen[n] = true
	}
}

// TestObjectLimits: the limits Go keeps of the BPF side are the object's.
func TestObjectLimits(t *testing.T) {
	spec, err := bpf.LoadCudatrace()
	if err != nil {
		t.Fatal(err)
	}
	if n := spec.Maps[bpf.CudatraceMapUsdtSpecs].MaxEntries; n != bpfUSDTMaxSpecs {
		t.Errorf("usdt_specs holds %d specs (CT_USDT_MAX_SPECS), bpfUSDTMaxSpecs is %d", n, bpfUSDTMaxSpecs)
	}
}

// TestHelpers: Helpers lists exactly the helpers the compiled programs
// call, so every one is checked against the running kernel; the *_noloop
// variants call no bpf_loop nor any helper as new, and every program
// loaded is in objects.
func TestHelpers(t *testing.T) {
	spec, err := bpf.LoadCudatrace()
	if err != nil {
		t.Fatal(err)
	}
	listed := map[asm.BuiltinFunc]bool{}
	for _, h := range Helpers {
		listed[h.Fn] = true
	}
	used := map[asm.BuiltinFunc][]string{}
	for name, p := range spec.Programs {
		for _, ins := range p.Instructions {
			if ins.IsBuiltinCall() {
				fn := asm.BuiltinFunc(ins.Constant)
				if !slices.Contains(used[fn], name) {
					used[fn] = append(used[fn], name)
				}
			}
		}
	}
	for fn, progs := range used {
		if !listed[fn] {
			t.Errorf("%s (called by %v) is not in Helpers: add it with the release that added it", helperName(fn), progs)
		}
	}
	for fn := range listed {
		if used[fn] == nil {
			t.Errorf("Helpers lists %s, which no program calls", helperName(fn))
		}
	}
	if !slices.Contains(used[asm.FnLoop], "ct_exit") {
		t.Errorf("ct_exit does not call bpf_loop: %v", used[asm.FnLoop])
	}
	// Nor any other helper as new as bpf_loop (bpf_find_vma): the
	// variants are for 5.15 and 5.16, whose verifier rejects a call to
	// one even on a path a map's value turns off.
	for name, variant := range noLoopVariants {
		for _, h := range Helpers {
			if h.Since == "5.17" && slices.Contains(used[h.Fn], variant) {
				t.Errorf("%s, the variant of %s for kernels without bpf_loop, calls %s (Linux %s)", variant, name, helperName(h.Fn), h.Since)
			}
		}
	}
	if got := helperName(asm.FnGetAttachCookie); got != "bpf_get_attach_cookie" {
		t.Errorf("helperName(FnGetAttachCookie) = %q", got)
	}
}
