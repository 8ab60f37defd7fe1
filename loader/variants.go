package loader

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/internal/hint"
)

// objects are the maps and the programs a Tracer loads: bpf2go's
// CudatraceObjects less the variants the running kernel does not take.
type objects struct {
	bpf.CudatraceMaps
	programs
}

// programs: one of each, in the variant chosen (see chooseVariants).
type programs struct {
	Ct3dEnter             *ebpf.Program `ebpf:"ct_3d_enter"`
	CtAllocEnter          *ebpf.Program `ebpf:"ct_alloc_enter"`
	CtCtxExit             *ebpf.Program `ebpf:"ct_ctx_exit"`
	CtCtxcreateEnter      *ebpf.Program `ebpf:"ct_ctxcreate_enter"`
	CtCtxpopEnter         *ebpf.Program `ebpf:"ct_ctxpop_enter"`
	CtCtxpushEnter        *ebpf.Program `ebpf:"ct_ctxpush_enter"`
	CtCtxretainEnter      *ebpf.Program `ebpf:"ct_ctxretain_enter"`
	CtCtxsetEnter         *ebpf.Program `ebpf:"ct_ctxset_enter"`
	CtExit                *ebpf.Program `ebpf:"ct_exit"`
	CtFork                *ebpf.Program `ebpf:"ct_fork"`
	CtFreeEnter           *ebpf.Program `ebpf:"ct_free_enter"`
	CtPitchEnter          *ebpf.Program `ebpf:"ct_pitch_enter"`
	CtSetdevEnter         *ebpf.Program `ebpf:"ct_setdev_enter"`
	CtSizedFreeEnter      *ebpf.Program `ebpf:"ct_sized_free_enter"`
	CtUsdt                *ebpf.Program `ebpf:"ct_usdt"`
	CtVmmCreateEnter      *ebpf.Program `ebpf:"ct_vmm_create_enter"`
	CtVmmMapEnter         *ebpf.Program `ebpf:"ct_vmm_map_enter"`
	CtCtxdestroyEnter     *ebpf.Program `ebpf:"ct_ctxdestroy_enter"`
	CtCtxdetachEnter      *ebpf.Program `ebpf:"ct_ctxdetach_enter"`
	CtCtxattachEnter      *ebpf.Program `ebpf:"ct_ctxattach_enter"`
	CtPrimaryReleaseEnter *ebpf.Program `ebpf:"ct_primary_release_enter"`
	CtPrimaryResetEnter   *ebpf.Program `ebpf:"ct_primary_reset_enter"`
	CtDevresetEnter       *ebpf.Program `ebpf:"ct_devreset_enter"`
	CtLearnCtxEnter       *ebpf.Program `ebpf:"ct_learn_ctx_enter"`
	CtLearnCtxdevEnter    *ebpf.Program `ebpf:"ct_learn_ctxdev_enter"`
	CtLearnRtdevEnter     *ebpf.Program `ebpf:"ct_learn_rtdev_enter"`
	CtLearnExit           *ebpf.Program `ebpf:"ct_learn_exit"`
}

func (o *objects) Close() error {
	var errs []error
	for _, p := range []*ebpf.Program{o.Ct3dEnter, o.CtAllocEnter, o.CtCtxExit, o.CtCtxcreateEnter,
		o.CtCtxpopEnter, o.CtCtxpushEnter, o.CtCtxretainEnter, o.CtCtxsetEnter, o.CtExit, o.CtFork,
		o.CtFreeEnter, o.CtPitchEnter, o.CtSetdevEnter, o.CtSizedFreeEnter, o.CtUsdt,
		o.CtVmmCreateEnter, o.CtVmmMapEnter, o.CtCtxdestroyEnter, o.CtCtxdetachEnter, o.CtCtxattachEnter,
		o.CtPrimaryReleaseEnter, o.CtPrimaryResetEnter, o.CtDevresetEnter,
		o.CtLearnCtxEnter, o.CtLearnCtxdevEnter, o.CtLearnRtdevEnter, o.CtLearnExit} {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	errs = append(errs, o.CudatraceMaps.Close())
	return errors.Join(errs...)
}

// noLoopVariants: the programs that walk Python frames, each to its
// variant without bpf_loop (bpf/python.h, py_stack).
var noLoopVariants = map[string]string{
	"ct_exit": "ct_exit_noloop",
	"ct_usdt": "ct_usdt_noloop",
}

// chooseVariants makes spec's programs the ones k takes: on a kernel
// without bpf_loop, ct_exit and ct_usdt load from their *_noloop twins
// (which keep that name in the kernel: `bpftool prog` shows which loaded).
func chooseVariants(spec *ebpf.CollectionSpec, k Kernel) error {
	if k.BPFLoop {
		return nil
	}
	for name, variant := range noLoopVariants {
		ps, ok := spec.Programs[variant]
		if !ok {
			return fmt.Errorf("BPF object has no program %s", variant)
		}
		spec.Programs[name] = ps
	}
	return nil
}

// verifierLogLines is how much of a verifier's log an error shows: its end
// says why the program was rejected.
const verifierLogLines = 4

// loadError words a failed load. A verifier's rejection shows the end of
// its log and writes the whole log to a file named in the message; a
// permission error on a kernel that charges BPF memory to RLIMIT_MEMLOCK
// says so.
func loadError(err error, k Kernel) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		tail := ve.Log
		if n := len(tail); n > 0 && strings.HasPrefix(tail[n-1], "processed ") {
			tail = tail[:n-1]
		}
		tail = tail[max(0, len(tail)-verifierLogLines):]
		where := "not saved"
		if f, ferr := os.CreateTemp("", "cudatrace-verifier-*.log"); ferr == nil {
			_, werr := f.WriteString(strings.Join(ve.Log, "\n") + "\n")
			if cerr := f.Close(); werr == nil && cerr == nil {
				where = f.Name()
			}
		}
		// err's own text is the program and the errno, then the log's
		// last line; the line that says why is among the last few.
		cause := strings.SplitN(err.Error(), "\n", 2)[0]
		return hint.Wrap(fmt.Errorf("load BPF programs on Linux %s: %s: the verifier rejected it: %s (its whole log, %d lines: %s)",
			k.Release, cause, strings.Join(tail, " | "), len(ve.Log), where),
			"this is a bug in cudatrace on this kernel: please report it with the log file")
	}
	if errors.Is(err, os.ErrPermission) && k.Memlock != nil {
		return hint.Wrap(fmt.Errorf("load BPF programs on Linux %s: %w", k.Release, err),
			fmt.Sprintf("this kernel charges BPF memory to RLIMIT_MEMLOCK and raising it failed (%v): run as root", k.Memlock))
	}
	return fmt.Errorf("load BPF programs on Linux %s: %w", k.Release, err)
}
