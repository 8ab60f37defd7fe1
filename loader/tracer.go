package loader

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// Options tune the BPF side. Zero values pick the defaults.
type Options struct {
	// FilterPIDs limits tracing to the processes given to AddPID (and, with
	// FollowForks, their descendants). Off means every process on the host.
	FilterPIDs  bool
	FollowForks bool
	// RingBytes is the ring buffer's size: a power of two, a multiple of the
	// page size. Bursts beyond it between two reads are lost (and counted).
	// 0 picks DefaultRingBytes.
	RingBytes uint32
	// WakeupBytes: records are submitted without waking the reader until this
	// much data is unread; the reader also polls every PollInterval. Waking
	// per record cost ~7.5 µs per event on the 6.18 VMs cudatrace was built
	// on, as much as the uprobe trap itself; each wakeup costs the reader
	// about 15-20 µs of CPU there (docs/benchmarks.md). The default is an
	// eighth of the ring: 8 MiB of a 64 MiB ring (some 30,000 records of
	// frames; the reader's poll comes first at any rate of events below
	// 600,000 a second), and seven eighths left for the reader to come
	// back before a record is lost.
	WakeupBytes  uint64
	PollInterval time.Duration
	// MaxInflight bounds the threads BPF keeps a call, a free and a device
	// of (bpf/common.h threads): those alive that made a traced call.
	MaxInflight uint32
	// StackWindow is how many bytes of user stack each allocation record
	// carries, from the stack pointer up, for unwinding code built without
	// frame pointers (CPython, libtorch, libcudart) in user space: a
	// multiple of 4096 up to MaxStackWindow. 0 picks DefaultStackWindow;
	// a negative value copies none (frame-pointer stacks only).
	StackWindow int
	// Learn attaches LearnProbes from the start: for sessions that follow
	// processes already running (--pid, --all), whose threads may have
	// chosen their device before tracing began.
	Learn bool
	// TraceStart is when tracing began (CLOCK_BOOTTIME ns, the records'
	// clock): a thread started before it may have chosen its device
	// unseen, and its records say events.DeviceUnknown until it shows
	// which (Learn). 0: every thread is taken as started after.
	TraceStart uint64
	// Unwind says where stacks are unwound (unwind.go); UnwindRows is
	// how many rows of call-frame rules BPF holds (0: DefaultUnwindRows).
	Unwind     UnwindMode
	UnwindRows uint32
}

const (
	// DefaultRingBytes is the ring buffer's default: records of frames
	// (256-512 bytes) under a burst on a loaded node. bench/burst.sh (10M
	// events, 8 threads beside 6 busy loops on 2 CPUs) lost 20,990 with
	// 16 MiB in one round of two, none with 32 MiB (2 rounds) or 64 MiB
	// (4): the reader, one thread among fifteen, fell more than 32 MiB
	// behind at times (docs/benchmarks.md). It is every stack window's:
	// it holds as many records of the largest window (~1,000 of 64 KiB)
	// as 16 MiB does of the default one (~930), where a 16 MiB ring held
	// 240 of 64 KiB and lost 16-850 events in 3 of 4 runs of bench/loop.c
	// on an idle 2-vCPU VM. The kernel's memory; the reader's mapping
	// counts it twice in VmRSS (the data pages are mapped twice, for
	// records that wrap).
	DefaultRingBytes    = 64 << 20
	MaxRingBytes        = 1 << 30 // what --ring-size takes
	DefaultPollInterval = 50 * time.Millisecond
	DefaultMaxInflight  = 16384
	// DefaultStackWindow: 16 KiB held every frame of the vmtest chains and
	// of CPython's eval loop a few calls deep; docs/benchmarks.md has what
	// the copy costs per event.
	DefaultStackWindow = 16 << 10
	MaxStackWindow     = 64 << 10 // CT_MAX_WINDOW
)

// MinRingRecords is how many of the largest records (an allocation with
// its stack window and Python block) the ring buffer must hold at least: a
// ring that holds fewer loses bursts of a few allocations every time.
const MinRingRecords = 8

// RecordBytes is the room one allocation record takes in the ring buffer
// with a stack window of window bytes (<= 0: none): what BPF reserves
// (alloc_record_size), plus the ring's 8-byte record header.
func RecordBytes(window int) uint32 {
	n := unsafe.Sizeof(bpf.CudatraceCtAllocEvent{}) +
		events.MaxPyFrames*unsafe.Sizeof(bpf.CudatraceCtPyframe{}) + unsafe.Sizeof(bpf.CudatraceCtPytrailer{})
	if window > 0 {
		n += unsafe.Sizeof(bpf.CudatraceCtUstack{}) + uintptr(window)
	}
	return uint32(n+7)&^7 + 8
}

// MinRingBytes is the smallest ring buffer (a power of two) that holds
// MinRingRecords allocation records with a stack window of window bytes.
func MinRingBytes(window int) uint32 {
	need := MinRingRecords * RecordBytes(window)
	r := uint32(4096)
	for r < need {
		r <<= 1
	}
	return r
}

// CheckRing says whether a ring of ring bytes is large enough for records
// with a stack window of window bytes (<= 0: none).
func CheckRing(ring uint32, window int) error {
	if need := MinRingBytes(window); ring < need {
		return fmt.Errorf("a ring buffer of %d bytes holds %d allocation records of %d bytes (stack window of %d bytes): it needs room for %d, at least %d bytes (%dKiB)",
			ring, ring/RecordBytes(window), RecordBytes(window), max(window, 0), MinRingRecords, need, need>>10)
	}
	return nil
}

func (o *Options) defaults() {
	if o.RingBytes == 0 {
		o.RingBytes = DefaultRingBytes
	}
	if o.WakeupBytes == 0 {
		o.WakeupBytes = uint64(o.RingBytes) / 8
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.StackWindow == 0 {
		o.StackWindow = DefaultStackWindow
	}
	if o.Unwind == UnwindDefault || o.StackWindow < 0 {
		o.Unwind = UnwindOff // the window (or, without one, frame pointers only)
	}
	if o.UnwindRows == 0 {
		o.UnwindRows = DefaultUnwindRows
	}
}

// Tracer owns the BPF objects, the links that attach them and the ring
// buffer reader. Close releases all of them; the kernel also drops every
// probe when the process dies, however it dies, since each is held by a file
// descriptor.
type Tracer struct {
	opts   Options
	objs   objects
	kernel Kernel
	fork   link.Link
	exit   link.Link // ct_proc_exit
	exec   link.Link // ct_exec
	reader *ring
	// specs are the USDT specs written to the usdt_specs map, each once
	// (specKeys: its index, the sites' cookie): the same PyTorch build in
	// every container image and virtual environment of a node has the
	// same sites' specs, which a map of its own each would fill (256) in
	// some weeks of jobs, and every later one's tensor probes with it.
	specs    uint32
	specKeys map[bpf.CudatraceCtUsdtSpec]uint32
	// ldProbes are ct_dl_notify's probes on dynamic loaders (ld.so
	// files), each tried once (dlnotify.go).
	ldProbes fileProbes
	// codeFree are the probes on interpreters' code_dealloc (codefree.go).
	codeFree fileProbes

	// libs are the libraries attached (Attach), by file, each with its
	// probes. The learning probes (LearnProbes): on while learning, over
	// every library attached; closing them runs in the background
	// (closing, waited for by Detach). Attach, Learn, ForgetLibrary and
	// Detach run on one goroutine (record's reader). detached: Detach
	// has run, and nothing is attached again (Run hands over what is
	// left in the ring after it: a record read then that asks for a
	// probe must not put one in, which Close would then wait out).
	libs     map[proc.FileID]*attached
	ending   map[proc.FileID]chan struct{} // libraries forgotten, closed once their probes are gone
	learning bool
	detached bool
	closing  sync.WaitGroup

	// Unwinding in BPF (unwind.go): the mode, uw_rows' memory mapping,
	// the value SetUnwindMaps writes.
	uwMode     UnwindMode
	uwRowsMem  []byte // uw_rows mapped (mapUnwind)
	uwIndexMem []byte // uw_index's
	uwProc     *bpf.CudatraceCtUwProc
	uwGen      uint64 // the last ct_uw_proc.gen written (SetUnwindMaps)
	// readerRaised: Run's thread ran at readerNice (priority.go).
	readerRaised bool
}

// attached is a library the tracer probes, with its probes and its
// functions' offsets: what the learning probes attach to when they are
// turned on. ex is f's /proc/self/fd path (proc.FDPath): f stays open
// while ex may attach, and until the library is forgotten
// (ForgetLibrary) or the tracer closes.
type attached struct {
	ex    *link.Executable
	fns   map[string]uint64
	f     *os.File
	links []link.Link // its probes
	learn []link.Link // the learning probes on it, while learning
}

// New loads the BPF programs. It attaches nothing yet.
func New(opts Options) (*Tracer, error) {
	opts.defaults()
	window := uint32(max(opts.StackWindow, 0))
	if window%4096 != 0 || window > MaxStackWindow {
		return nil, fmt.Errorf("stack window of %d bytes: must be a multiple of 4096 up to %d", opts.StackWindow, MaxStackWindow)
	}
	if err := CheckRing(opts.RingBytes, opts.StackWindow); err != nil {
		return nil, err
	}
	k, err := ProbeKernel()
	if err != nil {
		return nil, err
	}
	t := &Tracer{opts: opts, kernel: k, learning: opts.Learn, uwMode: opts.Unwind}
	t.objs.warmBTF()
	spec, err := newSpec(opts, k)
	if err != nil {
		return nil, err
	}

	// ct_usdt (with its Python walk, one of the costliest to verify) only
	// once a library has PyTorch's USDT probes: most runs never need it,
	// and libc10_cuda is mostly found after start-up.
	if err := t.objs.load(spec, bpf.CudatraceProgCtUsdt); err != nil {
		return nil, loadError(err, k)
	}
	if opts.FilterPIDs && opts.FollowForks {
		t.fork, err = link.AttachTracing(link.TracingOptions{Program: t.objs.CtFork})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attach fork tracepoint (to follow child processes): %w", err)
		}
	}
	// A traced process's end (bpf/exit.h): the ledger releases what it
	// held.
	t.exit, err = link.AttachTracing(link.TracingOptions{Program: t.objs.CtProcExit})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("attach exit tracepoint (to release what an ended process held): %w", err)
	}
	// A traced process's exec (bpf/notify.h): its Python layout goes,
	// and the reader captures what it runs now.
	t.exec, err = link.AttachTracing(link.TracingOptions{Program: t.objs.CtExec})
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("attach exec tracepoint (to follow what a traced process runs): %w", err)
	}
	t.reader, err = newRing(t.objs.Events)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	if err := t.mapUnwind(); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// newSpec is the BPF object as opts and kernel k take it: the variants
// chosen, the constants set, the maps sized.
func newSpec(opts Options, k Kernel) (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadCudatrace()
	if err != nil {
		return nil, fmt.Errorf("load BPF spec: %w", err)
	}
	if err := chooseVariants(spec, k, opts.FilterPIDs && opts.FollowForks); err != nil {
		return nil, err
	}
	window := uint32(max(opts.StackWindow, 0))
	set := map[string]any{
		bpf.CudatraceVarFilterPids:   boolByte(opts.FilterPIDs),
		bpf.CudatraceVarFollowForks:  boolByte(opts.FollowForks),
		bpf.CudatraceVarWakeupBytes:  opts.WakeupBytes,
		bpf.CudatraceVarStackWindow:  window,
		bpf.CudatraceVarTraceStartNs: opts.TraceStart,
		bpf.CudatraceVarExitApi:      uint16(events.ProcessExit),
		bpf.CudatraceVarPycodeApi:    uint16(events.PyCode),
		bpf.CudatraceVarExecApi:      uint16(events.ProcessExec),
		bpf.CudatraceVarMappedApi:    uint16(events.LibrariesMapped),
		bpf.CudatraceVarUwMode:       uwModes[opts.Unwind],
	}
	for name, v := range set {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	spec.Maps[bpf.CudatraceMapEvents].MaxEntries = opts.RingBytes
	spec.Maps[bpf.CudatraceMapThreads].MaxEntries = opts.MaxInflight
	spec.Maps[bpf.CudatraceMapUwRows].MaxEntries = opts.UnwindRows
	spec.Maps[bpf.CudatraceMapUwIndex].MaxEntries = opts.UnwindRows
	return spec, nil
}

// ReaderRaised says whether the reader (Run) ran ahead of busy threads,
// at readerNice; false where the kernel refused (no CAP_SYS_NICE).
func (t *Tracer) ReaderRaised() bool { return t.readerRaised }

// Kernel says what the running kernel offered and which program variants
// were loaded.
func (t *Tracer) Kernel() Kernel { return t.kernel }

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// ForgetLibrary ends the probes on library file id (Attach), and closes
// its file, when end is called: closing a uprobe waits out an RCU grace
// period (28-116 ms here), so call it off the reader's goroutine. Attach
// may attach the file again after. The caller knows that no process maps
// it: its calls would go untraced.
func (t *Tracer) ForgetLibrary(id proc.FileID) (end func()) {
	a := t.libs[id]
	delete(t.libs, id)
	if a == nil {
		return func() {}
	}
	for k, ch := range t.ending { // those over: no Attach waits for them
		select {
		case <-ch:
			delete(t.ending, k)
		default:
		}
	}
	ended := make(chan struct{})
	if t.ending == nil {
		t.ending = map[proc.FileID]chan struct{}{}
	}
	t.ending[id] = ended
	return func() {
		defer close(ended)
		closeAll(slices.Concat(a.links, a.learn)) //nolint:errcheck // nothing to do about a probe that would not close
		a.f.Close()
	}
}

// AttachedLibraries is how many library files the tracer probes.
func (t *Tracer) AttachedLibraries() int { return len(t.libs) }

// AttachResult says what Attach did with one library.
type AttachResult struct {
	Library  Library
	Symbols  []string // attached
	Missing  []string // optional symbols the library lacks
	Programs int      // uprobes and uretprobes created
}

// Attach probes every allocation entry point lib exports. A library that
// exports no known symbol, or lacks a required one of a table it uses, is an
// error; optional symbols it lacks are listed in the result. On error
// nothing stays attached from this library. After Detach: ErrDetached.
//
// The file is opened once, through proc.Open (never blocking, only a
// regular file, a container's path resolved inside its root) and only
// if it is still the file Libraries.Add saw (device and inode); its
// symbols are read and its probes attached through that descriptor
// (/proc/self/fd/N, which the kernel resolves to exactly that inode),
// never through the path again.
func (t *Tracer) Attach(lib Library) (res AttachResult, err error) {
	res = AttachResult{Library: lib}
	if t.detached {
		return res, fmt.Errorf("%s: %w", lib.Path, ErrDetached)
	}
	id := proc.FileID{Dev: lib.Dev, Ino: lib.Inode}
	if t.libs[id] != nil {
		return res, fmt.Errorf("%s: attached already", lib.Path)
	}
	if ended := t.ending[id]; ended != nil {
		// Its probes, forgotten, are still closing (ForgetLibrary's end):
		// attached beside them, each call would be recorded twice.
		<-ended
		delete(t.ending, id)
	}
	f, err := proc.Open(lib.Path, &id)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", lib.Path, err)
	}
	kept := false
	defer func() {
		if !kept {
			f.Close()
		}
	}()
	fdPath := proc.FDPath(f)
	fns, err := ProbedFunctions(fdPath)
	if err != nil {
		return res, fmt.Errorf("read %s: %w", lib.Path, err)
	}
	var sites []site
	at := map[uint64]bool{} // two names of one function (aliases) are probed once
	for _, table := range Tables {
		var tableSites []site
		var tableSyms, tableMissing, requiredMissing []string
		for _, p := range table.Probes {
			off, ok := fns[p.Symbol]
			if !ok {
				if p.Required {
					requiredMissing = append(requiredMissing, p.Symbol)
				}
				tableMissing = append(tableMissing, p.Symbol)
				continue
			}
			tableSyms = append(tableSyms, p.Symbol)
			if at[off] {
				continue
			}
			at[off] = true
			ps, err := t.probeSites(p, off)
			if err != nil {
				return res, err
			}
			tableSites = append(tableSites, ps...)
		}
		if len(tableSyms) == 0 {
			continue // the library is not of this table's kind
		}
		if len(requiredMissing) > 0 {
			return res, fmt.Errorf("%s exports %s symbols but lacks %v: not a CUDA library cudatrace understands",
				lib.Path, table.Name, requiredMissing)
		}
		sites = append(sites, tableSites...)
		res.Symbols = append(res.Symbols, tableSyms...)
		res.Missing = append(res.Missing, tableMissing...)
	}
	usdt, err := t.usdtSites(fdPath)
	if err != nil {
		return res, fmt.Errorf("%s: %w", lib.Path, err)
	}
	sites = append(sites, usdt...)
	for _, u := range usdt {
		res.Symbols = append(res.Symbols, u.name)
	}
	if len(res.Symbols) == 0 {
		return res, fmt.Errorf("%s exports none of the CUDA allocation functions cudatrace probes (cudaMalloc, cuMemAlloc_v2, ...): %w",
			lib.Path, ErrNotCUDA)
	}
	ex, err := link.OpenExecutable(fdPath)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", lib.Path, err)
	}
	// The return probes go first: an entry without its return would leave
	// calls remembered forever, a return without entry is merely ignored.
	slices.SortStableFunc(sites, func(a, b site) int {
		return cmp.Compare(boolByte(b.ret), boolByte(a.ret))
	})
	added, err := t.attach(ex, sites)
	if err != nil {
		return res, fmt.Errorf("attach to %s: %w", lib.Path, err)
	}
	res.Programs = len(sites)
	a := &attached{ex: ex, fns: fns, f: f, links: added}
	if t.libs == nil {
		t.libs = map[proc.FileID]*attached{}
	}
	t.libs[id] = a
	kept = true
	if t.learning {
		a.learn = t.attachLearn(a)
	}
	return res, nil
}

// attach attaches sites the way the programs were loaded for: with
// uprobe_multi links where the kernel has them (chooseVariants), one
// uprobe link each elsewhere. A program loaded for uprobe_multi does not
// attach as a plain uprobe.
func (t *Tracer) attach(ex *link.Executable, sites []site) ([]link.Link, error) {
	if t.kernel.UprobeMulti {
		return attachMulti(ex, sites)
	}
	return attachEach(ex, sites)
}

// attachLearn attaches the LearnProbes ex exports. They are optional: one
// that fails to attach leaves those threads' devices unknown, never wrong.
func (t *Tracer) attachLearn(a *attached) []link.Link {
	var out []link.Link
	at := map[uint64]bool{} // as in Attach: an alias probed once
	for _, p := range LearnProbes {
		off, ok := a.fns[p.Symbol]
		if !ok || at[off] {
			continue
		}
		at[off] = true
		sites, err := t.probeSites(p, off)
		if err != nil {
			continue
		}
		ls, err := t.attach(a.ex, sites)
		if err == nil {
			out = append(out, ls...)
		}
	}
	return out
}

// Learning reports whether the learning probes (LearnProbes) are on.
func (t *Tracer) Learning() bool { return t.learning }

// Learn turns the learning probes on or off over every library attached.
// Off, their links close in the background: each close waits out an RCU
// grace period, which the reader must not. Once detached they stay off.
func (t *Tracer) Learn(on bool) {
	if on == t.learning || (on && t.detached) {
		return
	}
	t.learning = on
	if on {
		for _, a := range t.libs {
			a.learn = t.attachLearn(a)
		}
		return
	}
	var ls []link.Link
	for _, a := range t.libs {
		ls = append(ls, a.learn...)
		a.learn = nil
	}
	t.closeInBackground(ls)
}

func (t *Tracer) closeInBackground(ls []link.Link) {
	for _, l := range ls {
		t.closing.Add(1)
		go func() {
			defer t.closing.Done()
			l.Close()
		}()
	}
}

// site is one uprobe: a program on a function's entry or return, or on a
// USDT probe site.
type site struct {
	name   string // the function, or provider:name
	prog   *ebpf.Program
	ret    bool
	addr   uint64 // file offset
	refCtr uint64 // file offset of a USDT semaphore, 0 for none
	cookie uint64 // the API, or the USDT spec's index
}

// attachEach attaches one perf-event uprobe per site: what kernels before
// uprobe_multi links (6.6) offer. On error nothing stays attached.
func attachEach(ex *link.Executable, sites []site) ([]link.Link, error) {
	var out []link.Link
	for _, s := range sites {
		opts := &link.UprobeOptions{Address: s.addr, RefCtrOffset: s.refCtr, Cookie: s.cookie}
		attach := ex.Uprobe
		if s.ret {
			attach = ex.Uretprobe
		}
		l, err := attach(s.name, s.prog, opts)
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("%s at %#x: %w", s.name, s.addr, err)
		}
		out = append(out, l)
	}
	return out, nil
}

// attachMulti attaches each program to all its sites with one
// uprobe_multi link (a cookie per site), returns before entries: a few
// links where attachEach makes one per site, and, above all, a few to
// close at detach, each close waiting out one RCU grace period.
func attachMulti(ex *link.Executable, sites []site) ([]link.Link, error) {
	type key struct {
		prog *ebpf.Program
		ret  bool
	}
	var order []key
	groups := map[key]*link.UprobeMultiOptions{}
	names := map[key][]string{}
	for _, s := range sites {
		k := key{s.prog, s.ret}
		g := groups[k]
		if g == nil {
			g = &link.UprobeMultiOptions{}
			groups[k] = g
			order = append(order, k)
		}
		g.Addresses = append(g.Addresses, s.addr)
		g.RefCtrOffsets = append(g.RefCtrOffsets, s.refCtr)
		g.Cookies = append(g.Cookies, s.cookie)
		names[k] = append(names[k], s.name)
	}
	var out []link.Link
	for _, k := range order {
		g := groups[k]
		if !slices.ContainsFunc(g.RefCtrOffsets, func(o uint64) bool { return o != 0 }) {
			g.RefCtrOffsets = nil
		}
		attach := ex.UprobeMulti
		if k.ret {
			attach = ex.UretprobeMulti
		}
		l, err := attach(nil, k.prog, g)
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("%s: %w", strings.Join(names[k], ", "), err)
		}
		out = append(out, l)
	}
	return out, nil
}

// closeAll closes links side by side: each uprobe's close waits out an RCU
// grace period in the kernel (uprobe_unregister), 60-90 ms apiece on a
// busy 2-core machine, so 108 perf-event uprobes closed one after another
// took 8-10 s. Closed side by side the waits overlap.
func closeAll(links []link.Link) error {
	errs := make([]error, len(links))
	var wg sync.WaitGroup
	for i, l := range links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Close()
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// USDTProbes are the statically defined tracepoints cudatrace attaches to,
// by provider:name: PyTorch's caching allocator reports each tensor's
// memory with pytorch:malloc(ptr, device, size, stream) and pytorch:free(ptr)
// (c10/cuda/CUDACachingAllocator.cpp, in libc10_cuda.so).
var USDTProbes = map[string]events.API{
	"pytorch:malloc": events.TorchMalloc,
	"pytorch:free":   events.TorchFree,
}

// usdtSites are ct_usdt's sites in the file: every site of a USDTProbes
// probe, each with the spec of its arguments written to the usdt_specs
// map (the cookie is its index). A file without them has none.
func (t *Tracer) usdtSites(path string) ([]site, error) {
	probes, err := ReadUSDT(path)
	if err != nil {
		return nil, err
	}
	var out []site
	for _, p := range probes {
		name := p.Provider + ":" + p.Name
		api, ok := USDTProbes[name]
		if !ok {
			continue
		}
		free := api.Info().Op == events.OpFree
		need := 3 // ptr, device, size
		if free {
			need = 1 // ptr
		}
		if len(p.Args) < need {
			return nil, fmt.Errorf("%s: USDT probe %s has %d arguments, want at least %d", path, name, len(p.Args), need)
		}
		var spec bpf.CudatraceCtUsdtSpec
		spec.Api = uint16(api)
		spec.Nargs = uint16(min(len(p.Args), len(spec.Args)))
		if free {
			spec.IsFree = 1
		}
		for i := 0; i < int(spec.Nargs); i++ {
			a := p.Args[i]
			spec.Args[i].Kind, spec.Args[i].Size, spec.Args[i].RegOff, spec.Args[i].Val = uint8(a.Kind), a.Size, a.RegOff, a.Value
		}
		prog, err := t.objs.program(bpf.CudatraceProgCtUsdt)
		if err != nil {
			return nil, loadError(err, t.kernel)
		}
		key, ok := t.specKeys[spec]
		if !ok {
			if t.specs >= bpfUSDTMaxSpecs {
				return nil, fmt.Errorf("%s: more than %d distinct USDT probe sites in all", path, bpfUSDTMaxSpecs)
			}
			key = t.specs
			if err := t.objs.UsdtSpecs.Put(key, &spec); err != nil {
				return nil, fmt.Errorf("%s: USDT spec of %s: %w", path, name, err)
			}
			t.specs++
			if t.specKeys == nil {
				t.specKeys = map[bpf.CudatraceCtUsdtSpec]uint32{}
			}
			t.specKeys[spec] = key
		}
		out = append(out, site{name: name, prog: prog, addr: p.Offset, refCtr: p.Semaphore, cookie: uint64(key)})
	}
	return out, nil
}

// bpfUSDTMaxSpecs is CT_USDT_MAX_SPECS (bpf/cudatrace.h).
const bpfUSDTMaxSpecs = 256

// ErrNotCUDA says a file has no CUDA symbols to probe.
var ErrNotCUDA = errors.New("not a CUDA library")

// probePrograms returns the programs of a probe of shape s: the entry
// program, and the return program, nil for the shapes whose record the
// entry probe makes.
func (t *Tracer) probePrograms(s Shape) (enter, exit *ebpf.Program, err error) {
	for exitName, entries := range shapePrograms {
		if name, ok := entries[s]; ok {
			return t.objs.byName[name], t.objs.byName[exitName], nil
		}
	}
	return nil, nil, fmt.Errorf("unknown shape %d", s)
}

// probeSites are p's uprobes, on the function at file offset off.
func (t *Tracer) probeSites(p Probe, off uint64) ([]site, error) {
	enter, exit, err := t.probePrograms(p.Shape)
	if err != nil {
		return nil, err
	}
	out := []site{{name: p.Symbol, prog: enter, addr: off, cookie: uint64(p.API)}}
	if exit != nil {
		out = append(out, site{name: p.Symbol, prog: exit, ret: true, addr: off, cookie: uint64(p.API)})
	}
	return out, nil
}

// AddPID adds a process to the filter (with FilterPIDs). cudaLater says
// it has loaded no CUDA library yet: its threads, though they ran before
// tracing began, cannot have chosen a device unseen (their device is not
// unknown, events.DeviceUnknown).
func (t *Tracer) AddPID(pid uint32, cudaLater bool) error {
	v := uint8(1) // bpf/cudatrace.h CT_PID_TRACED
	if cudaLater {
		v = 2 // CT_PID_CUDA_LATER
	}
	if err := t.objs.Pids.Put(pid, v); err != nil {
		return fmt.Errorf("trace pid %d: %w", pid, mapErr(err))
	}
	return nil
}

// ErrMapFull says a BPF map keyed by process was full of living
// processes' entries: what it would have held of one more is left out
// (and counted: the map_full counter for BPF's own updates).
var ErrMapFull = errors.New("BPF map full of living processes")

// mapErr names a full map's error (E2BIG) as ErrMapFull.
func mapErr(err error) error {
	if errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("%w (%v)", ErrMapFull, err)
	}
	return err
}

// SetPython tells the BPF programs where process pid's CPython keeps its
// thread states and how they are laid out (pystack.Interp.BPF, which
// checks it is one the walk takes): its allocation records carry the
// allocating thread's Python frames from then on.
func (t *Tracer) SetPython(pid uint32, o *bpf.CudatraceCtPyoffsets) error {
	if err := t.objs.PyProcs.Put(pid, o); err != nil {
		return fmt.Errorf("python layout of pid %d: %w", pid, mapErr(err))
	}
	return nil
}

// PythonProcess is the layout BPF holds for process pid (SetPython, or
// its loader's note, from py_files); ok is false where it holds none.
func (t *Tracer) PythonProcess(pid uint32) (o bpf.CudatraceCtPyoffsets, ok bool) {
	return o, t.objs.PyProcs.Lookup(pid, &o) == nil
}

// pyFileKey is struct py_file_key (bpf/notify.h).
type pyFileKey struct {
	Ino uint64
	Dev uint32 // the kernel's encoding: major << 20 | minor
	Pad uint32
}

// pyFileKeyOf is py_files' key of a file by its device, as
// /proc/PID/maps writes it (major:minor, hex), and inode.
func pyFileKeyOf(dev string, ino uint64) (pyFileKey, error) {
	var major, minor uint32
	if _, err := fmt.Sscanf(dev, "%x:%x", &major, &minor); err != nil {
		return pyFileKey{}, fmt.Errorf("device %q: %w", dev, err)
	}
	return pyFileKey{Ino: ino, Dev: major<<20 | minor}, nil
}

// SetPythonFile tells the BPF programs the layout of an interpreter file
// (the file of a mapping: its major:minor as /proc/PID/maps writes it,
// and inode), with o.InterpHead relative to the file's load bias
// (pystack.Interp.BPFFile): a process whose dynamic loader maps that file
// gets its layout from BPF itself (bpf/notify.h py_learn), before its
// first allocation.
func (t *Tracer) SetPythonFile(dev string, ino uint64, o *bpf.CudatraceCtPyoffsets) error {
	k, err := pyFileKeyOf(dev, ino)
	if err != nil {
		return err
	}
	if err := t.objs.PyFiles.Put(k, o); err != nil {
		return fmt.Errorf("python layout of inode %d: %w", ino, mapErr(err))
	}
	return nil
}

// PythonFile is the layout BPF holds for an interpreter file
// (SetPythonFile's dev and ino).
func (t *Tracer) PythonFile(dev string, ino uint64) (*bpf.CudatraceCtPyoffsets, error) {
	k, err := pyFileKeyOf(dev, ino)
	if err != nil {
		return nil, err
	}
	var o bpf.CudatraceCtPyoffsets
	if err := t.objs.PyFiles.Lookup(k, &o); err != nil {
		return nil, fmt.Errorf("python layout of inode %d: %w", ino, err)
	}
	return &o, nil
}

// Forget drops every entry BPF keeps of process pid by its PID: its place
// in the PID filter, its Python layout, its procs entry. BPF does so itself
// at the process's end (bpf/exit.h ct_proc_exit); this is for what that
// missed: an entry the reader put in after the process ended (it read the
// process just before), found by its sweep (Sweep).
func (t *Tracer) Forget(pid uint32) {
	// absent: nothing to forget
	_ = t.objs.Pids.Delete(pid)
	_ = t.objs.PyProcs.Delete(pid)
	_ = t.objs.UwProcs.Delete(pid)
	_ = t.objs.Procs.Delete(pid)
}

// Sweep forgets (Forget) every process in the maps keyed by process whose
// PID alive says is not alive, and returns how many it forgot. The
// kernel's exit (ct_proc_exit) ends nearly all of them; what it leaves is
// the reader's late writes, and a process the filter or py_procs took
// after it had ended.
func (t *Tracer) Sweep(alive func(pid uint32) bool) int {
	dead := map[uint32]bool{}
	isDead := func(pid uint32) bool {
		if d, ok := dead[pid]; ok {
			return d
		}
		dead[pid] = !alive(pid)
		return dead[pid]
	}
	for _, m := range []*ebpf.Map{t.objs.Procs, t.objs.Pids, t.objs.PyProcs, t.objs.UwProcs} {
		_ = walkKeys(m, func(key []byte) { // a walk cut short: the next sweep's
			isDead(binary.LittleEndian.Uint32(key))
		})
	}
	n := 0
	for pid, d := range dead {
		if d {
			t.Forget(pid)
			n++
		}
	}
	// Contexts are keyed by process and handle (bpf/contexts.h ctx_key):
	// BPF cannot list a process's handles at its exit, so its entries go
	// here, a key at a time, collected first (deleting under a walk
	// restarts it).
	for _, m := range []*ebpf.Map{t.objs.CtxDev, t.objs.CtxRefs} {
		var gone [][]byte
		_ = walkKeys(m, func(key []byte) {
			if isDead(binary.LittleEndian.Uint32(key)) {
				gone = append(gone, slices.Clone(key))
			}
		})
		for _, k := range gone {
			_ = m.Delete(k) // gone already (LRU): nothing to forget
		}
	}
	return n
}

// MapUse is how full one BPF map keyed by process, thread or file is.
type MapUse struct {
	Name              string
	Entries, Capacity uint32
}

// KeyedMaps are the BPF maps that hold per-process, per-thread or
// per-file state: what must stay bounded by what is alive (MapUse).
var KeyedMaps = []string{
	bpf.CudatraceMapProcs, bpf.CudatraceMapPids, bpf.CudatraceMapPyProcs, bpf.CudatraceMapPyThreads,
	bpf.CudatraceMapPySeen, bpf.CudatraceMapPyFiles, bpf.CudatraceMapThreads, bpf.CudatraceMapCtxStacks,
	bpf.CudatraceMapCtxInflight, bpf.CudatraceMapPrimaries, bpf.CudatraceMapCtxDev, bpf.CudatraceMapCtxRefs,
	bpf.CudatraceMapUwProcs,
}

// MapUses counts the entries of each of KeyedMaps, by walking its keys
// (one system call a key: tens of milliseconds for a full 64K map), for
// the sweep and the agent's metrics, never per event.
func (t *Tracer) MapUses() ([]MapUse, error) {
	var out []MapUse
	for _, name := range KeyedMaps {
		m := t.objs.maps[name]
		if m == nil {
			return nil, fmt.Errorf("no BPF map %s", name)
		}
		u := MapUse{Name: name, Capacity: m.MaxEntries()}
		if err := walkKeys(m, func([]byte) { u.Entries++ }); err != nil {
			return nil, fmt.Errorf("count the entries of %s: %w", name, err)
		}
		out = append(out, u)
	}
	return out, nil
}

// walkKeys calls each with every key of m (its bytes, valid during the
// call; one system call a key), at most MaxEntries of them: keys deleted
// under the walk restart it, and it stays bounded by what the map holds.
func walkKeys(m *ebpf.Map, each func(key []byte)) error {
	var prev any // nil: the first key
	cur, next := make([]byte, m.KeySize()), make([]byte, m.KeySize())
	for n := uint32(0); n < m.MaxEntries(); n++ {
		err := m.NextKey(prev, next)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		each(next)
		cur, next = next, cur
		prev = cur
	}
	return nil
}

// ForgetPythonFile drops the layout of an interpreter file (SetPythonFile)
// whose inode may now be another file's.
func (t *Tracer) ForgetPythonFile(dev string, ino uint64) {
	if k, err := pyFileKeyOf(dev, ino); err == nil {
		_ = t.objs.PyFiles.Delete(k) // absent: nothing to forget
	}
}

// TracedPIDs lists the processes in the PID filter: those given, and their
// descendants the fork hook added.
func (t *Tracer) TracedPIDs() []uint32 {
	var pids []uint32
	var pid uint32
	var v uint8
	it := t.objs.Pids.Iterate()
	for it.Next(&pid, &v) {
		pids = append(pids, pid)
	}
	return pids
}

// Handler receives what Run reads.
type Handler interface {
	// Record gets one raw ring-buffer record: the ring's own memory,
	// read-only, and valid only until Record returns (BPF writes over it
	// after). What is kept beyond the call must be copied.
	Record(raw []byte)
	// Tick is called at least every PollInterval, between records.
	Tick()
}

// Idler is a Handler told when the ring buffer has no more records for
// now (Idle): what it put off in the hope of more of the same (record's
// notes of one process, one after another) it does then.
type Idler interface {
	Idle()
}

// readBatch is how many records Run hands over between two looks at the
// clock (Tick).
const readBatch = 256

// Run reads records until ctx is done, then detaches every probe, hands
// over what is still in the ring buffer, and returns. Wait errors are
// reported through errf and reading goes on.
func (t *Tracer) Run(ctx context.Context, h Handler, errf func(error)) error {
	restore, raised := raiseReader()
	defer restore()
	t.readerRaised = raised
	last := time.Now()
	idler, _ := h.(Idler)
	read := func() int {
		n := t.reader.read(h.Record, readBatch)
		if n < readBatch && idler != nil {
			idler.Idle()
		}
		return n
	}
	for ctx.Err() == nil {
		// Records come in batches: BPF wakes the reader only at a
		// process's first record, an exec or library load of one
		// (bpf/notify.h), or past WakeupBytes unread.
		// The clock is read once a batch, not per record.
		if read() == 0 {
			if err := t.reader.wait(t.opts.PollInterval - time.Since(last)); err != nil {
				errf(err)
			}
			// What came while waiting (records below the wakeup mark wait
			// for the poll) is handed over before Tick, which writes the
			// samples taken meanwhile (NVML): in the file, a sample then
			// follows the records made before it.
			read()
		}
		if now := time.Now(); now.Sub(last) >= t.opts.PollInterval {
			last = now
			h.Tick()
		}
	}
	t.Detach()
	// What is left in the ring buffer, without waiting for more: the
	// probes are gone, so no record is being written.
	for read() > 0 {
	}
	h.Tick()
	return nil
}

// Detach removes every probe; the maps and the reader stay readable.
func (t *Tracer) Detach() error {
	// The learning probes close with the rest, side by side; closing.Wait
	// waits for those Learn(false) left closing in the background.
	var ls []link.Link
	for _, a := range t.libs {
		ls = append(ls, a.links...)
		ls = append(ls, a.learn...)
		a.links, a.learn = nil, nil
	}
	err := closeAll(slices.Concat(ls, t.codeFree.take(), t.ldProbes.take()))
	t.learning = false
	t.detached = true
	t.closing.Wait()
	var first error
	if err != nil {
		first = fmt.Errorf("detach: %w", err)
	}
	if t.exit != nil {
		if err := t.exit.Close(); err != nil && first == nil {
			first = fmt.Errorf("detach exit tracepoint: %w", err)
		}
		t.exit = nil
	}
	if t.exec != nil {
		if err := t.exec.Close(); err != nil && first == nil {
			first = fmt.Errorf("detach exec tracepoint: %w", err)
		}
		t.exec = nil
	}
	if t.fork != nil {
		if err := t.fork.Close(); err != nil && first == nil {
			first = fmt.Errorf("detach fork tracepoint: %w", err)
		}
		t.fork = nil
	}
	return first
}

// CounterNames names the BPF counters, indexed by bpf/cudatrace.h's enum
// ct_counter through bpf2go's generated twin (a unit test checks that every
// counter has a name).
var CounterNames = []string{
	bpf.CudatraceCtCounterCT_CNT_EVENTS:          "events",
	bpf.CudatraceCtCounterCT_CNT_RB_FULL:         "ringbuf_full",
	bpf.CudatraceCtCounterCT_CNT_INFLIGHT_FULL:   "inflight_full",
	bpf.CudatraceCtCounterCT_CNT_NO_ENTRY:        "no_entry",
	bpf.CudatraceCtCounterCT_CNT_STALE:           "stale_entry",
	bpf.CudatraceCtCounterCT_CNT_NESTED:          "nested",
	bpf.CudatraceCtCounterCT_CNT_STACK_ERR:       "stack_error",
	bpf.CudatraceCtCounterCT_CNT_PYCODE_FULL:     "pycode_ring_full",
	bpf.CudatraceCtCounterCT_CNT_PY_PREEMPTED:    "python_preempted",
	bpf.CudatraceCtCounterCT_CNT_NOTE_FULL:       "notes_lost",
	bpf.CudatraceCtCounterCT_CNT_MAP_FULL:        "map_full",
	bpf.CudatraceCtCounterCT_CNT_UW_BPF:          "unwound_in_bpf",
	bpf.CudatraceCtCounterCT_CNT_UW_NOMAP:        "unwind_fallback_no_rules",
	bpf.CudatraceCtCounterCT_CNT_UW_RULE:         "unwind_fallback_rule",
	bpf.CudatraceCtCounterCT_CNT_RB_NOWINDOW:     "ringbuf_no_window",
	bpf.CudatraceCtCounterCT_CNT_UW_MEMO:         "unwound_from_memo",
	bpf.CudatraceCtCounterCT_CNT_UW_MEMO_CHANGED: "unwind_memo_changed",
}

// Counters sums the per-CPU BPF counters.
func (t *Tracer) Counters() (map[string]uint64, error) {
	out := make(map[string]uint64, len(CounterNames))
	for i, name := range CounterNames {
		var perCPU []uint64
		if err := t.objs.Counters.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// Lost sums the counters that mean an event was lost.
func Lost(c map[string]uint64) uint64 {
	return c["ringbuf_full"] + c["inflight_full"] + c["no_entry"] + c["stale_entry"]
}

// LossHint says what to do about the losses in c, by cause; "" when none.
// ring is the ring buffer's size the losses were counted with: the remedy
// names a size four times it (with 64 KiB windows, 4x the ring took the
// losses of bench/loop.c from hundreds to none: docs/benchmarks.md).
//
// raised says whether the reader ran ahead of busy threads (ReaderRaised):
// where it did not, a full ring is more often a reader starved of CPU by
// the job's threads than a burst, and the first remedy is CAP_SYS_NICE.
func LossHint(c map[string]uint64, ring uint32, raised bool) string {
	var parts []string
	if n := c["ringbuf_full"]; n > 0 {
		bigger := min(4*uint64(ring), MaxRingBytes)
		if !raised {
			more := ""
			if bigger > uint64(ring) {
				more = ", or raise --ring-size, e.g. --ring-size " + sizeName(bigger)
			}
			parts = append(parts, fmt.Sprintf("%d with the ring buffer (%s) full while the reader ran at the job's priority: give cudatrace CAP_SYS_NICE "+
				"(its reader then runs at nice %d, ahead of busy threads)%s", n, sizeName(uint64(ring)), readerNice, more))
		} else if bigger > uint64(ring) {
			parts = append(parts, fmt.Sprintf("%d with the ring buffer (%s) full: raise --ring-size, e.g. --ring-size %s (each allocation record holds its stack window: a smaller --stack-window fits more)",
				n, sizeName(uint64(ring)), sizeName(bigger)))
		} else {
			parts = append(parts, fmt.Sprintf("%d with the ring buffer (%s, the largest) full: a smaller --stack-window fits more records", n, sizeName(uint64(ring))))
		}
	}
	if n := c["inflight_full"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d with %d threads already kept: more live threads have made CUDA calls than BPF keeps", n, DefaultMaxInflight))
	}
	if n := c["no_entry"] + c["stale_entry"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d calls whose entry was missed (in progress when the probes attached)", n))
	}
	return strings.Join(parts, "; ")
}

// NoWindowHint says what n allocation records kept without their stack
// windows (the reader was more than half the ring buffer, ring bytes,
// behind, or the ring had no room for the window: bpf/alloc.h
// ring_behind) mean, and what to do about them.
func NoWindowHint(n uint64, ring uint32) string {
	fix := "a smaller --stack-window fits more"
	if bigger := min(4*uint64(ring), MaxRingBytes); bigger > uint64(ring) {
		fix = "raise --ring-size, e.g. --ring-size " + sizeName(bigger)
	}
	return fmt.Sprintf("%d allocations were recorded without their stack windows (the reader was behind by more than half the ring buffer, %s, in a burst): each is in every figure, its native frames from frame pointers alone (shallower where code has none); %s",
		n, sizeName(uint64(ring)), fix)
}

// sizeName writes a power of two of bytes as --ring-size reads it.
func sizeName(b uint64) string {
	switch {
	case b >= 1<<30 && b%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", b>>30)
	case b >= 1<<20 && b%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", b>>20)
	case b >= 1<<10 && b%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", b>>10)
	}
	return fmt.Sprintf("%d", b)
}

// Close detaches and frees everything; it returns the first error.
func (t *Tracer) Close() error {
	first := t.Detach()
	for _, a := range t.libs {
		a.f.Close()
	}
	t.libs = nil
	if err := t.unmapUnwind(); err != nil && first == nil {
		first = fmt.Errorf("unmap the unwind tables: %w", err)
	}
	if t.reader != nil {
		if err := t.reader.Close(); err != nil && first == nil {
			first = fmt.Errorf("close ring buffer: %w", err)
		}
		t.reader = nil
	}
	if err := t.objs.Close(); err != nil && first == nil {
		first = fmt.Errorf("close BPF objects: %w", err)
	}
	return first
}
