// Command verifierstats says what the kernel's verifier spends on each of
// the named BPF programs (default ct_exit) when it is loaded alone with
// the recorder's constants, once with stacks copied as windows (uw_mode
// 0) and once unwound in BPF (uw_mode 1): the instructions it processed,
// its states, and the load's wall time. The verifier's check of the
// return programs is most of `record`'s start-up (docs/benchmarks.md);
// this tells which change moves it. With VERIFIER_LOG=functions it also
// says, for each function of a program (its global functions, and the
// callbacks checked with their callers), how many instructions the
// verifier went through there: where a path is followed once for each
// number a register could hold, that function stands out. Needs root.
// Usage:
//
//	go run ./bench/verifierstats [PROGRAM...]
package main

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
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
			log := coll.Programs[name].VerifierLog
			insns, states := stats(log)
			coll.Close()
			fmt.Printf("%-8d %-16s %10s %10s %8s\n", mode, name, insns, states, took.Round(time.Millisecond))
			if perFunction() {
				for _, f := range byFunction(log) {
					fmt.Printf("%8s   %-26s %10d\n", "", f.name, f.insns)
				}
			}
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

// logLevel is the verifier's log level: its statistics; with
// VERIFIER_LOG=branch the instructions of the path it refused, to see why;
// with VERIFIER_LOG=functions every instruction it went through (a log of
// hundreds of MB, and a load some 50 times slower).
func logLevel() ebpf.LogLevel {
	switch os.Getenv("VERIFIER_LOG") {
	case "branch":
		return ebpf.LogLevelStats | ebpf.LogLevelBranch
	case "functions":
		return ebpf.LogLevelStats | ebpf.LogLevelInstruction
	}
	return ebpf.LogLevelStats
}

func perFunction() bool { return os.Getenv("VERIFIER_LOG") == "functions" }

type function struct {
	name  string
	insns int
}

var (
	funcStart = regexp.MustCompile(`^func#(\d+) @(\d+)$`)
	funcName  = regexp.MustCompile(`^Func#(\d+) \('(\w+)'\)`)
	srcLine   = regexp.MustCompile(`^; (?:static )?\S+ \S*?(\w+)\(`)
	insnLine  = regexp.MustCompile(`^(\d+): \(`)
)

// byFunction counts the instructions of an instruction-level verifier log
// by the function they belong to (the log's "func#N @insn" lines say where
// each begins), most first. Global functions are named by the log; others
// by the first source line the log shows of them, where that is their
// declaration, else by number.
func byFunction(log string) []function {
	type fn struct{ start, n int }
	var starts []fn
	names := map[int]string{}
	counts := map[int]int{}
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		if m := funcStart.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			at, _ := strconv.Atoi(m[2])
			starts = append(starts, fn{at, n})
			continue
		}
		if m := funcName.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			names[n] = m[2]
			continue
		}
		m := insnLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		at, _ := strconv.Atoi(m[1])
		k := sort.Search(len(starts), func(j int) bool { return starts[j].start > at }) - 1
		if k < 0 {
			continue
		}
		f := starts[k]
		counts[f.n]++
		if _, ok := names[f.n]; !ok && at == f.start && i > 0 {
			if s := srcLine.FindStringSubmatch(lines[i-1]); s != nil {
				names[f.n] = s[1]
			}
		}
	}
	var out []function
	for n, c := range counts {
		name := names[n]
		if name == "" {
			name = fmt.Sprintf("func#%d", n)
		}
		out = append(out, function{name, c})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].insns > out[j].insns })
	return out
}
