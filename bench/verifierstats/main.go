// Command verifierstats says what the kernel's verifier spends on each of
// the named BPF programs (default ct_exit) when it is loaded alone with
// the recorder's constants, once with stacks copied as windows (uw_mode
// 0) and once unwound in BPF (uw_mode 1): the instructions it processed,
// its states, and the load's wall time. The verifier's check of the
// return programs is most of `record`'s start-up (docs/benchmarks.md);
// this tells which change moves it. Needs root. Usage:
//
//	go run ./bench/verifierstats [PROGRAM...]
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/loader"
)

func main() {
	names := os.Args[1:]
	if len(names) == 0 {
		names = []string{bpf.CudatraceProgCtExit}
	}
	if err := run(names); err != nil {
		fmt.Fprintln(os.Stderr, "verifierstats:", err)
		os.Exit(1)
	}
}

func run(names []string) error {
	fmt.Printf("%-8s %-16s %10s %10s %8s\n", "uw_mode", "program", "insns", "states", "load")
	for _, mode := range []uint8{0, 1} {
		for _, name := range names {
			spec, err := bpf.LoadCudatrace()
			if err != nil {
				return fmt.Errorf("load BPF spec: %w", err)
			}
			ps, ok := spec.Programs[name]
			if !ok {
				return fmt.Errorf("no program %q in the BPF object", name)
			}
			set := map[string]any{
				bpf.CudatraceVarStackWindow: uint32(loader.DefaultStackWindow),
				bpf.CudatraceVarUwMode:      mode,
				bpf.CudatraceVarWakeupBytes: uint64(1 << 20),
			}
			for v, val := range set {
				if err := spec.Variables[v].Set(val); err != nil {
					return fmt.Errorf("set %s: %w", v, err)
				}
			}
			one := &ebpf.CollectionSpec{Maps: spec.Maps, Programs: map[string]*ebpf.ProgramSpec{name: ps},
				Variables: spec.Variables, Types: spec.Types}
			start := time.Now()
			coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{
				Programs: ebpf.ProgramOptions{LogLevel: logLevel()}})
			took := time.Since(start)
			if err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) && len(ve.Log) > 0 {
					// The verifier's last lines say why.
					fmt.Fprintln(os.Stderr, strings.Join(ve.Log[max(0, len(ve.Log)-30):], "\n"))
				}
				return fmt.Errorf("uw_mode %d, %s: %w", mode, name, err)
			}
			insns, states := stats(coll.Programs[name].VerifierLog)
			coll.Close()
			fmt.Printf("%-8d %-16s %10s %10s %8s\n", mode, name, insns, states, took.Round(time.Millisecond))
		}
	}
	return nil
}

// stats finds "processed N insns" and "total_states N" in a verifier log.
func stats(log string) (insns, states string) {
	insns, states = "?", "?"
	f := strings.Fields(log)
	for i := 0; i+1 < len(f); i++ {
		switch {
		case f[i] == "processed":
			insns = f[i+1]
		case f[i] == "total_states":
			states = f[i+1]
		}
	}
	return insns, states
}

// logLevel is the verifier's log level: its statistics, and with
// VERIFIER_LOG=branch the instructions of the path it refused, to see why.
func logLevel() ebpf.LogLevel {
	if os.Getenv("VERIFIER_LOG") == "branch" {
		return ebpf.LogLevelStats | ebpf.LogLevelBranch
	}
	return ebpf.LogLevelStats
}
