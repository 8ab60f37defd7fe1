package loader

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/internal/hint"
)

// objects are the maps and the programs a Tracer loaded, in bpf2go's own
// structs: a program the run does not take (the variant the kernel does
// not, ct_fork without FollowForks) stays nil.
type objects struct {
	bpf.CudatraceMaps
	bpf.CudatracePrograms
	byName map[string]*ebpf.Program // the programs loaded, by the names the kernel's twins had in spec
}

func (o *objects) Close() error {
	return errors.Join(o.CudatracePrograms.Close(), o.CudatraceMaps.Close())
}

// load loads every map of spec and the programs in it, and hands them to
// o by their `ebpf` names.
func (o *objects) load(spec *ebpf.CollectionSpec) error {
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		return err
	}
	defer coll.Close() // what was not handed over: nothing, unless an error comes
	if err := coll.Assign(&o.CudatraceMaps); err != nil {
		return err
	}
	o.byName = make(map[string]*ebpf.Program)
	progs := reflect.ValueOf(&o.CudatracePrograms).Elem()
	for i := range progs.NumField() {
		name := progs.Type().Field(i).Tag.Get("ebpf")
		if p := coll.DetachProgram(name); p != nil {
			progs.Field(i).Set(reflect.ValueOf(p))
			o.byName[name] = p
		}
	}
	return nil
}

// noLoopVariants: the programs that walk Python frames, each to its
// variant without bpf_loop (bpf/python.h, py_stack).
var noLoopVariants = map[string]string{
	"ct_exit": "ct_exit_noloop",
	"ct_usdt": "ct_usdt_noloop",
}

// chooseVariants leaves in spec the programs a run takes and no other:
// on a kernel without bpf_loop, ct_exit and ct_usdt load from their
// *_noloop twins (which keep that name in the kernel: `bpftool prog` shows
// which loaded), elsewhere the twins are dropped; ct_fork only with
// fork. Where the kernel has uprobe_multi links, the uprobe programs are
// loaded for them (one link attaches a program to many functions).
func chooseVariants(spec *ebpf.CollectionSpec, k Kernel, fork bool) error {
	for name, variant := range noLoopVariants {
		ps, ok := spec.Programs[variant]
		if !ok {
			return fmt.Errorf("BPF object has no program %s", variant)
		}
		if !k.BPFLoop {
			spec.Programs[name] = ps
		}
		delete(spec.Programs, variant)
	}
	if !fork {
		delete(spec.Programs, "ct_fork")
	}
	if k.UprobeMulti {
		for _, ps := range spec.Programs {
			if ps.Type == ebpf.Kprobe {
				ps.AttachType = ebpf.AttachTraceUprobeMulti
			}
		}
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
