package loader

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

// TestLoadErrorVerifier: a verifier's rejection shows the lines that say
// why (the end of the log, less its statistics) and writes the whole log
// to the file the message names.
func TestLoadErrorVerifier(t *testing.T) {
	var log []string
	for i := 0; i < 300; i++ {
		log = append(log, fmt.Sprintf("%d: (bf) r%d = r1", i, i%10))
	}
	log = append(log, "invalid access to memory, mem_size=18024 off=16496 size=4096",
		"R2 min value is outside of the allowed memory range",
		"processed 2345 insns (limit 1000000) max_states_per_insn 4")
	ve := &ebpf.VerifierError{Cause: syscall.EACCES, Log: log}
	err := loadError(fmt.Errorf("field CtExit: program ct_exit: load program: %w", ve), Kernel{Release: "6.1.0-50-amd64"})
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Errorf("message has several lines:\n%s", msg)
	}
	for _, want := range []string{"Linux 6.1.0-50-amd64", "program ct_exit", "invalid access to memory, mem_size=18024",
		"R2 min value is outside of the allowed memory range", "303 lines"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "0: (bf) r0 = r1") || strings.Contains(msg, "processed 2345") {
		t.Errorf("message carries more than the log's end:\n%s", msg)
	}
	m := regexp.MustCompile(`(/\S+cudatrace-verifier-\S+\.log)`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("message names no log file:\n%s", msg)
	}
	defer os.Remove(m[1])
	b, rerr := os.ReadFile(m[1])
	if rerr != nil {
		t.Fatal(rerr)
	}
	if string(b) != strings.Join(log, "\n")+"\n" {
		t.Errorf("%s holds %d bytes, not the whole log", m[1], len(b))
	}
	if hint.Of(err) == "" {
		t.Error("no hint")
	}
}

// TestLoadErrorMemlock: EPERM where the kernel charges BPF memory to
// RLIMIT_MEMLOCK and lifting it failed says so; elsewhere it does not.
func TestLoadErrorMemlock(t *testing.T) {
	perm := fmt.Errorf("map create: %w", os.ErrPermission)
	err := loadError(perm, Kernel{Release: "5.10.0-32-amd64", Memlock: errors.New("operation not permitted")})
	if !strings.Contains(hint.Of(err), "RLIMIT_MEMLOCK") || !errors.Is(err, os.ErrPermission) {
		t.Errorf("err %q hint %q", err, hint.Of(err))
	}
	err = loadError(perm, Kernel{Release: "6.18.0"})
	if strings.Contains(err.Error()+hint.Of(err), "MEMLOCK") {
		t.Errorf("memlock blamed on a kernel that accounts by cgroup: %q %q", err, hint.Of(err))
	}
}

// The programs are verified side by side against maps made first (load):
// each must be the program one collection loads from the same object, its
// constants (.rodata: the stack window, the unwinding mode) set as New
// set them. The verifier's count of the instructions it went through
// tells: with a constant left zero it prunes other branches (ct_exit went
// through 68,388 instructions, where 345,337 unwinding in BPF).
func TestLoadSideBySide(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	for _, mode := range []UnwindMode{UnwindOff, UnwindBPF} {
		opts := Options{Unwind: mode, FilterPIDs: true, FollowForks: true}
		opts.defaults()
		tr, err := New(opts)
		if err != nil {
			testenv.SkipOrFail(t, "load BPF: %v", err)
		}
		spec, err := newSpec(opts, tr.Kernel())
		if err != nil {
			tr.Close()
			t.Fatal(err)
		}
		delete(spec.Programs, bpf.CudatraceProgCtUsdt) // loaded on first use
		one, err := ebpf.NewCollection(spec)
		if err != nil {
			tr.Close()
			t.Fatal(err)
		}
		if len(one.Programs) != len(tr.objs.byName) {
			t.Errorf("mode %d: %d programs loaded, one collection loads %d", mode, len(tr.objs.byName), len(one.Programs))
		}
		for name, want := range one.Programs {
			got := tr.objs.byName[name]
			if got == nil {
				t.Errorf("mode %d: %s not loaded", mode, name)
				continue
			}
			gi, err1 := got.Info()
			wi, err2 := want.Info()
			if err1 != nil || err2 != nil {
				t.Fatalf("program info: %v, %v", err1, err2)
			}
			gn, ok1 := gi.VerifiedInstructions()
			wn, ok2 := wi.VerifiedInstructions()
			if !ok1 || !ok2 {
				t.Skipf("this kernel does not count verified instructions")
			}
			if gn != wn {
				t.Errorf("mode %d: %s: the verifier went through %d instructions, %d loaded as one collection", mode, name, gn, wn)
			}
		}
		one.Close()
		tr.Close()
	}
}

// TestVerifierWork: the return programs stay cheap to verify. The
// verifier's check of ct_exit, alone on one CPU while the other programs
// load beside it, is most of `record`'s start-up, and ct_usdt's is a
// PyTorch process's first tensor event's wait. Each has paths the verifier
// follows once per number a register could hold: a frame count kept in a
// register made it check ct_keep_nowindow's Python copy and records once
// for each of 127 counts (ct_exit 345,337 instructions with unwinding in
// BPF, 237,862 without, where now about a third of that). The bounds
// leave room for the programs to grow, not for that to come back.
func TestVerifierWork(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_BPF: run as root")
	}
	limits := map[string]uint32{bpf.CudatraceProgCtExit: 150_000, bpf.CudatraceProgCtUsdt: 260_000}
	k, err := ProbeKernel()
	if err != nil {
		testenv.SkipOrFail(t, "probe the kernel: %v", err)
	}
	for _, mode := range []UnwindMode{UnwindOff, UnwindBPF} {
		opts := Options{Unwind: mode, FilterPIDs: true, FollowForks: true}
		opts.defaults()
		spec, err := newSpec(opts, k)
		if err != nil {
			t.Fatal(err)
		}
		for name := range spec.Programs {
			if _, ok := limits[name]; !ok {
				delete(spec.Programs, name)
			}
		}
		coll, err := ebpf.NewCollection(spec)
		if err != nil {
			t.Fatalf("mode %d: load: %v", mode, err)
		}
		for name, limit := range limits {
			p := coll.Programs[name]
			if p == nil {
				t.Errorf("mode %d: %s not loaded", mode, name)
				continue
			}
			info, err := p.Info()
			if err != nil {
				t.Fatalf("program info: %v", err)
			}
			n, ok := info.VerifiedInstructions()
			if !ok {
				t.Skipf("this kernel does not count verified instructions")
			}
			t.Logf("mode %d: %s: %d instructions verified", mode, name, n)
			if n > limit {
				t.Errorf("mode %d: %s: the verifier went through %d instructions, want at most %d", mode, name, n, limit)
			}
		}
		coll.Close()
	}
}

// TestStackChains: no program's chain of calls takes more than the BPF
// stack's 512 bytes as Linux 6.1 counts them: each function's frame (the
// deepest stack slot its code touches) rounded up to 32 bytes, summed
// along each chain of calls (a bpf_loop callback's as called where it is
// named). Newer kernels (the hosts here: 6.13 on gives x86-64 programs a
// private stack) load a chain that 6.1 and 6.12 refuse, so this checks
// what those would: the return programs use nearly all of the stack
// themselves, and a global function that called another took ct_exit to
// 544 bytes there. Every program of the object is checked, the variants
// without bpf_loop too. The frames are read from the code, so that a
// function the verifier finds dead on this kernel counts as on another.
// They are checked against the verifier's own "stack depth" where it
// checked them all.
func TestStackChains(t *testing.T) {
	// Both architectures' objects: their programs differ (struct
	// pt_regs, the registers read), and so do their frames.
	for _, obj := range []string{"../bpf/cudatrace_x86_bpfel.o", "../bpf/cudatrace_arm64_bpfel.o"} {
		spec, err := ebpf.LoadCollectionSpec(obj)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for name, ps := range spec.Programs {
			fns, err := stackFrames(ps.Instructions)
			if err != nil {
				t.Fatalf("%s: %s: %v", obj, name, err)
			}
			worst, chain := deepestChain(fns)
			t.Logf("%s: %s: %d bytes: %s", obj, name, worst, strings.Join(chain, " > "))
			if worst > 512 {
				t.Errorf("%s: %s: a chain of calls takes %d bytes of stack as Linux 6.1 counts it, more than 512: %s",
					obj, name, worst, strings.Join(chain, " > "))
			}
			checked++
		}
		if checked < 20 {
			t.Fatalf("%s: %d programs checked", obj, checked)
		}
	}
	// The frames read from the code are the verifier's, where every
	// function is live: ct_exit unwinding in BPF.
	if os.Geteuid() != 0 {
		return
	}
	k, err := ProbeKernel()
	if err != nil {
		testenv.SkipOrFail(t, "probe the kernel: %v", err)
	}
	opts := Options{Unwind: UnwindBPF, FilterPIDs: true, FollowForks: true}
	opts.defaults()
	full, err := newSpec(opts, k)
	if err != nil {
		t.Fatal(err)
	}
	name := bpf.CudatraceProgCtExit
	one := &ebpf.CollectionSpec{Maps: full.Maps, Programs: map[string]*ebpf.ProgramSpec{name: full.Programs[name]},
		Variables: full.Variables, Types: full.Types}
	coll, err := ebpf.NewCollectionWithOptions(one, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	defer coll.Close()
	want, err := stackDepths(coll.Programs[name].VerifierLog)
	if err != nil {
		t.Fatal(err)
	}
	fns, err := stackFrames(full.Programs[name].Instructions)
	if err != nil {
		t.Fatal(err)
	}
	if len(fns) != len(want) {
		t.Fatalf("%s: %d functions in the code, the verifier gave %d stack depths", name, len(fns), len(want))
	}
	for i, f := range fns {
		if f.loop {
			f.depth += 3 * 8
		}
		if f.depth != want[i] {
			t.Errorf("%s: function %s: %d bytes of stack read from the code, the verifier's %d", name, f.name, f.depth, want[i])
		}
	}
}

// stackDepths reads the verifier's "stack depth A+B+..." line: each
// function's stack, in the order of the functions in the program.
func stackDepths(log string) ([]int, error) {
	for _, l := range strings.Split(log, "\n") {
		f, ok := strings.CutPrefix(l, "stack depth ")
		if !ok {
			continue
		}
		var ds []int
		for _, s := range strings.Split(strings.TrimSpace(f), "+") {
			var d int
			if _, err := fmt.Sscan(s, &d); err != nil {
				return nil, fmt.Errorf("stack depth line %q: %w", l, err)
			}
			ds = append(ds, d)
		}
		return ds, nil
	}
	return nil, fmt.Errorf("no stack depth line in the verifier's log")
}

// frameFn is a function of a program: its name, the deepest byte of
// stack its code touches below its frame pointer (r10), and the
// functions it calls or hands to a helper as a callback.
type frameFn struct {
	name  string
	depth int
	// It calls bpf_loop: Linux 6.0 on inlines the call where the
	// callback is known, and keeps three registers in the caller's frame
	// (in the verifier's "stack depth", not in its check of the chains,
	// made before).
	loop  bool
	calls []string
}

// stackFrames reads each function's frame from a program's code (the
// program, then the functions it calls, as the loader lays them out): the
// deepest of every load or store at r10 plus an offset, and of every
// pointer made as r10 plus an offset (clang's code makes a stack
// object's address so, its lowest byte).
func stackFrames(insns asm.Instructions) ([]frameFn, error) {
	var fns []frameFn
	var fromFP [11]bool // registers holding r10 (plus nothing yet)
	for _, ins := range insns {
		if s := ins.Symbol(); s != "" {
			fns = append(fns, frameFn{name: s})
			fromFP = [11]bool{}
		}
		if len(fns) == 0 {
			return nil, fmt.Errorf("code before the first function")
		}
		f := &fns[len(fns)-1]
		deeper := func(off int) {
			if off < 0 && -off > f.depth {
				f.depth = -off
			}
		}
		op := ins.OpCode
		switch cls := op.Class(); {
		case ins.IsFunctionCall() || ins.IsLoadOfFunctionPointer():
			f.calls = append(f.calls, ins.Reference())
		case ins.IsBuiltinCall() && asm.BuiltinFunc(ins.Constant) == asm.FnLoop:
			f.loop = true
		case cls == asm.LdXClass:
			if ins.Src == asm.R10 {
				deeper(int(ins.Offset))
			}
		case cls == asm.StXClass || cls == asm.StClass:
			if ins.Dst == asm.R10 {
				deeper(int(ins.Offset))
			}
			continue
		case cls == asm.ALU64Class && op.ALUOp() == asm.Mov && op.Source() == asm.RegSource && ins.Src == asm.R10:
			fromFP[ins.Dst] = true
			continue
		case cls == asm.ALU64Class && op.ALUOp() == asm.Add && op.Source() == asm.ImmSource && ins.Dst <= asm.R10 && fromFP[ins.Dst]:
			deeper(int(ins.Constant))
			fromFP[ins.Dst] = false
			continue
		case op.JumpOp() == asm.Call:
			for r := asm.R0; r <= asm.R5; r++ {
				fromFP[r] = false
			}
			continue
		}
		if ins.Dst <= asm.R10 && op.Class() != asm.JumpClass && op.Class() != asm.Jump32Class {
			fromFP[ins.Dst] = false
		}
	}
	return fns, nil
}

// deepestChain is the most stack any chain of calls among fns takes,
// each frame rounded up to 32 bytes (at least 32), as Linux 6.1 counts
// it, and that chain's functions.
func deepestChain(fns []frameFn) (int, []string) {
	byName := map[string]*frameFn{}
	for i := range fns {
		byName[fns[i].name] = &fns[i]
	}
	var walk func(name string, seen []string) (int, []string)
	walk = func(name string, seen []string) (int, []string) {
		f := byName[name]
		if f == nil || slices.Contains(seen, name) {
			return 0, nil // not in the program, or recursion: the verifier refuses it on its own
		}
		best, bestChain := 0, []string(nil)
		for _, c := range f.calls {
			d, ch := walk(c, append(seen, name))
			if d > best {
				best, bestChain = d, ch
			}
		}
		return (max(f.depth, 1)+31)&^31 + best, append([]string{name}, bestChain...)
	}
	return walk(fns[0].name, nil)
}
