package loader

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"

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
