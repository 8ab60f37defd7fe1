package loader

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/watchdog"
)

// Options tune the BPF side. Zero values pick the defaults.
type Options struct {
	// FilterPIDs limits tracing to the processes given to AddPID (and, with
	// FollowForks, their descendants). Off means every process on the host.
	FilterPIDs  bool
	FollowForks bool
	// RingBytes is the ring buffer's size: a power of two, a multiple of the
	// page size. Bursts beyond it between two reads are lost (and counted).
	RingBytes uint32
	// WakeupBytes: records are submitted without waking the reader until this
	// much data is unread; the reader also polls every PollInterval. Waking
	// per record cost ~7.5 µs per event on the 6.18 VMs cudatrace was built
	// on, as much as the uprobe trap itself.
	WakeupBytes  uint64
	PollInterval time.Duration
	// MaxInflight bounds calls remembered between entry and return.
	MaxInflight uint32
	// StackWindow is how many bytes of user stack each allocation record
	// carries, from the stack pointer up, for unwinding code built without
	// frame pointers (CPython, libtorch, libcudart) in user space: a
	// multiple of 4096 up to MaxStackWindow. 0 picks DefaultStackWindow;
	// a negative value copies none (frame-pointer stacks only).
	StackWindow int
	// HoldNew stops each traced process at its first record (SIGSTOP from
	// BPF, the record flagged events.FlagHeld) until the reader has read
	// its mappings and sends SIGCONT, so that a process exiting right after
	// its first allocation still symbolizes. For launched commands: a
	// process some shell runs with job control would be seen stopping.
	HoldNew bool
}

const (
	DefaultRingBytes    = 16 << 20
	DefaultWakeupBytes  = 1 << 20
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
		o.WakeupBytes = min(DefaultWakeupBytes, uint64(o.RingBytes)/4)
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
}

// Tracer owns the BPF objects, the links that attach them and the ring
// buffer reader. Close releases all of them; the kernel also drops every
// probe when the process dies, however it dies, since each is held by a file
// descriptor.
type Tracer struct {
	opts   Options
	objs   objects
	kernel Kernel
	links  []link.Link
	fork   link.Link
	reader *ringbuf.Reader
	specs  uint32 // USDT specs written to the usdt_specs map
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
	spec, err := bpf.LoadCudatrace()
	if err != nil {
		return nil, fmt.Errorf("load BPF spec: %w", err)
	}
	if err := chooseVariants(spec, k); err != nil {
		return nil, err
	}
	set := map[string]any{
		bpf.CudatraceVarFilterPids:  boolByte(opts.FilterPIDs),
		bpf.CudatraceVarFollowForks: boolByte(opts.FollowForks),
		bpf.CudatraceVarWakeupBytes: opts.WakeupBytes,
		bpf.CudatraceVarStackWindow: window,
		bpf.CudatraceVarHoldNew:     boolByte(opts.HoldNew),
	}
	for name, v := range set {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	spec.Maps[bpf.CudatraceMapEvents].MaxEntries = opts.RingBytes
	spec.Maps[bpf.CudatraceMapInflight].MaxEntries = opts.MaxInflight

	t := &Tracer{opts: opts, kernel: k}
	if err := spec.LoadAndAssign(&t.objs, nil); err != nil {
		return nil, loadError(err, k)
	}
	if opts.FilterPIDs && opts.FollowForks {
		t.fork, err = link.AttachTracing(link.TracingOptions{Program: t.objs.CtFork})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attach fork tracepoint (to follow child processes): %w", err)
		}
	}
	t.reader, err = ringbuf.NewReader(t.objs.Events)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("open ring buffer: %w", err)
	}
	return t, nil
}

// Kernel says what the running kernel offered and which program variants
// were loaded.
func (t *Tracer) Kernel() Kernel { return t.kernel }

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

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
// nothing stays attached from this library.
func (t *Tracer) Attach(lib Library) (AttachResult, error) {
	res := AttachResult{Library: lib}
	ex, err := link.OpenExecutable(lib.Path)
	if err != nil {
		return res, fmt.Errorf("open %s: %w", lib.Path, err)
	}
	var added []link.Link
	rollback := func() {
		for _, l := range added {
			l.Close()
		}
	}
	for _, table := range Tables {
		var tableSyms, tableMissing []string
		var requiredMissing []string
		for _, p := range table.Probes {
			ls, err := t.attachProbe(ex, p)
			if isMissingSymbol(err) {
				if p.Required {
					requiredMissing = append(requiredMissing, p.Symbol)
				}
				tableMissing = append(tableMissing, p.Symbol)
				continue
			}
			if err != nil {
				rollback()
				return res, fmt.Errorf("attach %s in %s: %w", p.Symbol, lib.Path, err)
			}
			added = append(added, ls...)
			tableSyms = append(tableSyms, p.Symbol)
		}
		if len(tableSyms) == 0 {
			continue // the library is not of this table's kind
		}
		if len(requiredMissing) > 0 {
			rollback()
			return res, fmt.Errorf("%s exports %s symbols but lacks %v: not a CUDA library cudatrace understands",
				lib.Path, table.Name, requiredMissing)
		}
		res.Symbols = append(res.Symbols, tableSyms...)
		res.Missing = append(res.Missing, tableMissing...)
	}
	usdt, err := t.attachUSDT(ex, lib.Path)
	if err != nil {
		rollback()
		return res, err
	}
	added = append(added, usdt.links...)
	res.Symbols = append(res.Symbols, usdt.names...)
	if len(res.Symbols) == 0 {
		return res, fmt.Errorf("%s exports none of the CUDA allocation functions cudatrace probes (cudaMalloc, cuMemAlloc_v2, ...): %w",
			lib.Path, ErrNotCUDA)
	}
	t.links = append(t.links, added...)
	res.Programs = len(added)
	return res, nil
}

// USDTProbes are the statically defined tracepoints cudatrace attaches to,
// by provider:name: PyTorch's caching allocator reports each tensor's
// memory with pytorch:malloc(ptr, device, size, stream) and pytorch:free(ptr)
// (c10/cuda/CUDACachingAllocator.cpp, in libc10_cuda.so).
var USDTProbes = map[string]events.API{
	"pytorch:malloc": events.TorchMalloc,
	"pytorch:free":   events.TorchFree,
}

type usdtAttached struct {
	links []link.Link
	names []string // provider:name, one per probe site
}

// attachUSDT attaches ct_usdt to every site of a USDTProbes probe in the
// file, each with the spec of its arguments. A file without them gets
// nothing and no error.
func (t *Tracer) attachUSDT(ex *link.Executable, path string) (usdtAttached, error) {
	var res usdtAttached
	probes, err := ReadUSDT(path)
	if err != nil {
		return res, err
	}
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
			return res, fmt.Errorf("%s: USDT probe %s has %d arguments, want at least %d", path, name, len(p.Args), need)
		}
		if t.specs >= bpfUSDTMaxSpecs {
			return res, fmt.Errorf("%s: more than %d USDT probe sites in all", path, bpfUSDTMaxSpecs)
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
		key := t.specs
		if err := t.objs.UsdtSpecs.Put(key, &spec); err != nil {
			return res, fmt.Errorf("%s: USDT spec of %s: %w", path, name, err)
		}
		t.specs++
		l, err := ex.Uprobe(name, t.objs.CtUsdt, &link.UprobeOptions{Address: p.Offset,
			RefCtrOffset: p.Semaphore, Cookie: uint64(key)})
		if err != nil {
			for _, l := range res.links {
				l.Close()
			}
			return usdtAttached{}, fmt.Errorf("attach USDT %s at %#x in %s: %w", name, p.Offset, path, err)
		}
		res.links = append(res.links, l)
		res.names = append(res.names, name)
	}
	return res, nil
}

// bpfUSDTMaxSpecs is CT_USDT_MAX_SPECS (bpf/cudatrace.h).
const bpfUSDTMaxSpecs = 256

// ErrNotCUDA says a file has no CUDA symbols to probe.
var ErrNotCUDA = errors.New("not a CUDA library")

// isMissingSymbol: the symbol is absent, or only imported (undefined, so
// address 0: a library that calls the driver, as a runtime does), which
// cilium/ebpf reports as not supported.
func isMissingSymbol(err error) bool {
	return errors.Is(err, link.ErrNoSymbol) || errors.Is(err, errors.ErrUnsupported) ||
		errors.Is(err, ebpf.ErrNotSupported)
}

// probePrograms returns the programs of a probe of shape s: the entry
// program, and the return program, nil for the shapes whose record the
// entry probe makes.
func (t *Tracer) probePrograms(s Shape) (enter, exit *ebpf.Program, err error) {
	o := &t.objs
	withExit := map[Shape]*ebpf.Program{
		ShapeAlloc: o.CtAllocEnter, ShapePitch: o.CtPitchEnter, Shape3D: o.Ct3dEnter,
		ShapeSetDevice: o.CtSetdevEnter, ShapeVMMCreate: o.CtVmmCreateEnter, ShapeVMMMap: o.CtVmmMapEnter,
	}
	ctxExit := map[Shape]*ebpf.Program{ShapeCtxRetain: o.CtCtxretainEnter, ShapeCtxCreate: o.CtCtxcreateEnter}
	entryOnly := map[Shape]*ebpf.Program{
		ShapeFree: o.CtFreeEnter, ShapeSizedFree: o.CtSizedFreeEnter,
		ShapeCtxSet: o.CtCtxsetEnter, ShapeCtxPush: o.CtCtxpushEnter, ShapeCtxPop: o.CtCtxpopEnter,
		ShapeCtxDestroy: o.CtCtxdestroyEnter, ShapeCtxDetach: o.CtCtxdetachEnter, ShapeCtxAttach: o.CtCtxattachEnter,
		ShapePrimaryRelease: o.CtPrimaryReleaseEnter, ShapePrimaryReset: o.CtPrimaryResetEnter,
		ShapeDeviceReset: o.CtDevresetEnter,
	}
	if p, ok := withExit[s]; ok {
		return p, o.CtExit, nil
	}
	if p, ok := ctxExit[s]; ok {
		return p, o.CtCtxExit, nil
	}
	if p, ok := entryOnly[s]; ok {
		return p, nil, nil
	}
	return nil, nil, fmt.Errorf("unknown shape %d", s)
}

func (t *Tracer) attachProbe(ex *link.Executable, p Probe) ([]link.Link, error) {
	opts := &link.UprobeOptions{Cookie: uint64(p.API)}
	enter, exit, err := t.probePrograms(p.Shape)
	if err != nil {
		return nil, err
	}
	// The return probe goes first: an entry without its return would leave
	// calls remembered forever, a return without entry is merely ignored.
	var out []link.Link
	if exit != nil {
		l, err := ex.Uretprobe(p.Symbol, exit, opts)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	l, err := ex.Uprobe(p.Symbol, enter, opts)
	if err != nil {
		for _, l := range out {
			l.Close()
		}
		return nil, err
	}
	return append(out, l), nil
}

// Held is the map of processes BPF stopped (HoldNew) and the reader has
// not resumed: what internal/watchdog resumes if the tracer dies.
func (t *Tracer) Held() *ebpf.Map { return t.objs.Held }

// Resumed tells BPF's side that the reader sent pid SIGCONT after its held
// record: the watchdog need not.
func (t *Tracer) Resumed(pid uint32) {
	if t == nil || t.objs.Held == nil {
		return
	}
	t.objs.Held.Delete(pid) // absent: the watchdog resumed it first
}

// AddPID adds a process to the filter (with FilterPIDs).
func (t *Tracer) AddPID(pid uint32) error {
	if err := t.objs.Pids.Put(pid, uint8(1)); err != nil {
		return fmt.Errorf("trace pid %d: %w", pid, err)
	}
	return nil
}

// SetPython tells the BPF programs where process pid's CPython keeps its
// thread states and how they are laid out: its allocation records carry
// the allocating thread's Python frames from then on.
func (t *Tracer) SetPython(pid uint32, o *bpf.CudatraceCtPyoffsets) error {
	for _, f := range []struct {
		name      string
		off, size int64
	}{{"previous", o.FrPrevious, 8}, {"code", o.FrCode, 8}, {"instruction", o.FrInstr, 8}, {"owner", o.FrOwner, 1}, {"is_entry", o.FrEntry, 1}} {
		if f.off >= 0 && f.off+f.size > PyFrameRead || f.off < -1 || f.off == -1 && f.size == 8 {
			return fmt.Errorf("python layout of pid %d: frame field %s at %d lies past the %d bytes the walk reads of a frame", pid, f.name, f.off, PyFrameRead)
		}
	}
	if err := t.objs.PyProcs.Put(pid, o); err != nil {
		return fmt.Errorf("python layout of pid %d: %w", pid, err)
	}
	return nil
}

// PyFrameRead is CT_PY_FRAME_READ (bpf/cudatrace.h): the bytes of an
// interpreter frame the BPF walk reads at once, where each field it takes
// must lie (SetPython checks).
const PyFrameRead = 128

// ForgetPython drops a process's CPython layout (it exited).
func (t *Tracer) ForgetPython(pid uint32) {
	_ = t.objs.PyProcs.Delete(pid) // absent: nothing to forget
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
	// Record gets one raw ring-buffer record; raw is reused after return.
	Record(raw []byte)
	// Tick is called at least every PollInterval, between records.
	Tick()
}

// Run reads records until ctx is done, then detaches every probe, hands
// over what is still in the ring buffer, and returns. Read errors other
// than the reader being closed are reported through errf and reading goes
// on.
func (t *Tracer) Run(ctx context.Context, h Handler, errf func(error)) error {
	var rec ringbuf.Record
	last := time.Now()
	for ctx.Err() == nil {
		t.reader.SetDeadline(time.Now().Add(t.opts.PollInterval))
		err := t.reader.ReadInto(&rec)
		switch {
		case err == nil:
			h.Record(rec.RawSample)
		case errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, ringbuf.ErrClosed):
			return nil
		default:
			errf(fmt.Errorf("read ring buffer: %w", err))
		}
		if now := time.Now(); now.Sub(last) >= t.opts.PollInterval {
			last = now
			h.Tick()
		}
	}
	t.Detach()
	// A deadline in the past makes ReadInto return what is buffered, then
	// ErrDeadlineExceeded.
	t.reader.SetDeadline(time.Now())
	for {
		err := t.reader.ReadInto(&rec)
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, ringbuf.ErrClosed) {
				errf(fmt.Errorf("drain ring buffer: %w", err))
			}
			break
		}
		h.Record(rec.RawSample)
	}
	h.Tick()
	return nil
}

// Detach removes every probe; the maps and the reader stay readable.
func (t *Tracer) Detach() error {
	// Each uprobe's close waits out an RCU grace period in the kernel
	// (uprobe_unregister): 60-90 ms apiece on a busy 2-core machine, so
	// 108 probes closed one after another took 8-10 s. Closed side by side
	// the waits overlap.
	errs := make([]error, len(t.links))
	var wg sync.WaitGroup
	for i, l := range t.links {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.Close()
		}()
	}
	wg.Wait()
	var first error
	if err := errors.Join(errs...); err != nil {
		first = fmt.Errorf("detach: %w", err)
	}
	t.links = nil
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
	bpf.CudatraceCtCounterCT_CNT_EVENTS:        "events",
	bpf.CudatraceCtCounterCT_CNT_RB_FULL:       "ringbuf_full",
	bpf.CudatraceCtCounterCT_CNT_INFLIGHT_FULL: "inflight_full",
	bpf.CudatraceCtCounterCT_CNT_NO_ENTRY:      "no_entry",
	bpf.CudatraceCtCounterCT_CNT_STALE:         "stale_entry",
	bpf.CudatraceCtCounterCT_CNT_NESTED:        "nested",
	bpf.CudatraceCtCounterCT_CNT_STACK_ERR:     "stack_error",
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
func LossHint(c map[string]uint64) string {
	var parts []string
	if n := c["ringbuf_full"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d with the ring buffer full: raise --ring-size (each allocation record holds its stack window: a smaller --stack-window fits more)", n))
	}
	if n := c["inflight_full"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d with %d calls already in flight: too many threads inside CUDA calls at once", n, DefaultMaxInflight))
	}
	if n := c["no_entry"] + c["stale_entry"]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d calls whose entry was missed (in progress when the probes attached)", n))
	}
	return strings.Join(parts, "; ")
}

// Close detaches and frees everything; it returns the first error.
func (t *Tracer) Close() error {
	first := t.Detach()
	if t.opts.HoldNew && t.objs.Held != nil {
		// Processes stopped for records the reader never got to.
		watchdog.Resume(t.objs.Held, 0, nil)
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
