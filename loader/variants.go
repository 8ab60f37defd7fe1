package loader

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/internal/hint"
)

// objects are the maps and the programs a Tracer loaded, in bpf2go's own
// structs: a program the run does not take (the variant the kernel does
// not, ct_fork without FollowForks, ct_usdt until a library has USDT
// probes) stays nil.
type objects struct {
	bpf.CudatraceMaps
	bpf.CudatracePrograms
	// What was loaded by the names in spec (a *_noloop twin under the
	// name it stands in for); maps holds the internal ones (.rodata) too.
	byName map[string]*ebpf.Program
	maps   map[string]*ebpf.Map
	// later are the programs loaded on first use (program), with the
	// specs of the maps they use.
	later *ebpf.CollectionSpec
	// cache is the kernel's BTF, read once for every load.
	cache *btf.Cache
}

func (o *objects) Close() error {
	var errs []error
	for _, p := range o.byName {
		errs = append(errs, p.Close())
	}
	for _, m := range o.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}

// load loads every map of spec and its programs but those named in later,
// which program loads when first asked for, and hands them to o by their
// `ebpf` names. The verifier's work is most of a tracer's start-up, and
// one program (ct_exit, with the unwinder: ~90% of it) the most of that:
// the maps are made first, then the programs are verified in groups of
// about equal size side by side, one a CPU, the costliest program alone
// in its group where it outweighs the rest.
func (o *objects) load(spec *ebpf.CollectionSpec, later ...string) error {
	if o.cache == nil {
		o.warmBTF()
	}
	o.later = &ebpf.CollectionSpec{Maps: make(map[string]*ebpf.MapSpec), Programs: make(map[string]*ebpf.ProgramSpec),
		Types: spec.Types, ByteOrder: spec.ByteOrder}
	for _, name := range later {
		if ps, ok := spec.Programs[name]; ok {
			o.later.Programs[name] = ps
			delete(spec.Programs, name)
		}
	}
	for name, ms := range spec.Maps {
		o.later.Maps[name] = ms.Copy()
	}
	// Variables: the constants set (New) go into .rodata as it is made.
	mapsOnly := &ebpf.CollectionSpec{Maps: spec.Maps, Variables: spec.Variables, Programs: map[string]*ebpf.ProgramSpec{},
		Types: spec.Types, ByteOrder: spec.ByteOrder}
	coll, err := ebpf.NewCollectionWithOptions(mapsOnly, ebpf.CollectionOptions{Cache: o.cache})
	if err != nil {
		return err
	}
	o.byName = make(map[string]*ebpf.Program)
	o.maps = make(map[string]*ebpf.Map)
	for name := range coll.Maps {
		o.maps[name] = coll.DetachMap(name)
	}
	coll.Close() // what was not handed over: nothing
	ms := reflect.ValueOf(&o.CudatraceMaps).Elem()
	for i := range ms.NumField() {
		m := o.maps[ms.Type().Field(i).Tag.Get("ebpf")]
		if m == nil {
			o.Close()
			return fmt.Errorf("BPF object has no map %s", ms.Type().Field(i).Tag.Get("ebpf"))
		}
		ms.Field(i).Set(reflect.ValueOf(m))
	}
	groups := loadGroups(spec.Programs, runtime.NumCPU())
	loaded := make([]map[string]*ebpf.Program, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { loaded[i], errs[i] = o.loadPrograms(spec, g) })
	}
	wg.Wait()
	for _, progs := range loaded {
		for name, p := range progs {
			o.set(name, p)
		}
	}
	if err := errors.Join(errs...); err != nil {
		o.Close()
		return err
	}
	return nil
}

// warmBTF reads the kernel's BTF (for CO-RE relocations: ~20 ms) on a
// goroutine of its own, while the BPF object is read; the first load
// that needs it waits for it.
func (o *objects) warmBTF() {
	o.cache = btf.NewCache()
	go o.cache.Kernel() //nolint:errcheck // a load says the error
}

// loadGroups splits progs into up to n groups of about equal size by
// instructions (the verifier's work grows with them), largest first.
func loadGroups(progs map[string]*ebpf.ProgramSpec, n int) []map[string]*ebpf.ProgramSpec {
	names := make([]string, 0, len(progs))
	for name := range progs {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		a, b := len(progs[names[i]].Instructions), len(progs[names[j]].Instructions)
		return a > b || a == b && names[i] < names[j]
	})
	n = max(1, min(n, len(names)))
	groups := make([]map[string]*ebpf.ProgramSpec, n)
	size := make([]int, n)
	for _, name := range names {
		least := 0
		for i := range size {
			if size[i] < size[least] {
				least = i
			}
		}
		if groups[least] == nil {
			groups[least] = map[string]*ebpf.ProgramSpec{}
		}
		groups[least][name] = progs[name]
		size[least] += len(progs[name].Instructions)
	}
	var out []map[string]*ebpf.ProgramSpec
	for _, g := range groups {
		if g != nil {
			out = append(out, g)
		}
	}
	return out
}

// loadPrograms loads progs against the maps load made; what loaded is
// returned even with an error (load closes it).
func (o *objects) loadPrograms(spec *ebpf.CollectionSpec, progs map[string]*ebpf.ProgramSpec) (map[string]*ebpf.Program, error) {
	maps := make(map[string]*ebpf.MapSpec, len(spec.Maps))
	for name, ms := range spec.Maps {
		maps[name] = ms.Copy() // each loader its own: none shares what it may change
	}
	coll, err := ebpf.NewCollectionWithOptions(&ebpf.CollectionSpec{Maps: maps, Programs: progs, Types: spec.Types, ByteOrder: spec.ByteOrder},
		ebpf.CollectionOptions{MapReplacements: o.maps, Cache: o.cache})
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	out := make(map[string]*ebpf.Program, len(progs))
	for name := range coll.Programs {
		out[name] = coll.DetachProgram(name)
	}
	return out, nil
}

// set records a loaded program under its name in spec.
func (o *objects) set(name string, p *ebpf.Program) {
	o.byName[name] = p
	progs := reflect.ValueOf(&o.CudatracePrograms).Elem()
	for i := range progs.NumField() {
		if progs.Type().Field(i).Tag.Get("ebpf") == name {
			progs.Field(i).Set(reflect.ValueOf(p))
		}
	}
}

// program returns the program of that name, loading it against the maps
// already made if load left it for later.
func (o *objects) program(name string) (*ebpf.Program, error) {
	if p := o.byName[name]; p != nil {
		return p, nil
	}
	ps, ok := o.later.Programs[name]
	if !ok {
		return nil, fmt.Errorf("BPF object has no program %s", name)
	}
	spec := &ebpf.CollectionSpec{Maps: o.later.Maps, Programs: map[string]*ebpf.ProgramSpec{name: ps},
		Types: o.later.Types, ByteOrder: o.later.ByteOrder}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: o.maps, Cache: o.cache})
	if err != nil {
		return nil, err
	}
	defer coll.Close()
	p := coll.DetachProgram(name)
	o.set(name, p)
	delete(o.later.Programs, name)
	return p, nil
}

// noLoopVariants: the programs that walk Python frames or a loader's
// list of objects, each to its variant without bpf_loop (bpf/python.h
// py_walk, bpf/notify.h dl_report).
var noLoopVariants = map[string]string{
	"ct_exit":      "ct_exit_noloop",
	"ct_usdt":      "ct_usdt_noloop",
	"ct_dl_notify": "ct_dl_notify_noloop",
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
