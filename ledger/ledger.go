// Package ledger keeps the account of what each traced process holds, fed
// one decoded event (package events) at a time: live allocations by
// address, per-process and per-device totals with their peaks, failures,
// VMM mappings and the aggregate of every allocation stack. record, replay,
// top and the agent each run one; the reports and exports read it.
package ledger

import (
	"cmp"
	"hash/maphash"
	"iter"
	"maps"
	"slices"
	"unsafe"

	"github.com/cudatrace/cudatrace/events"
)

// Ledger keeps what each process holds: live allocations keyed by address,
// per-process and per-device totals with their peaks, failures, and
// allocation stacks. Apply it to events in the order the ring buffer
// delivered them; the BPF programs order frees before any reuse of their
// address (see bpf/cudatrace.bpf.c). It is not safe for concurrent use:
// readers copy what they need on the goroutine that applies events.
type Ledger struct {
	procs    map[uint32]*Process
	stacks   map[stackKey]*Stack
	seed     maphash.Seed
	maxFails int
	// last is the process of the last event and lastStack the stack of
	// the last allocation, each looked up again only when the next event
	// is another process's or another stack's: most events follow one of
	// the same process, and a loop allocates from one place over and over,
	// where each event took a map look-up, and each allocation a hash of
	// its frames and another. Forget drops them with their process.
	last      *Process
	lastStack *Stack
}

// Process is one traced process's account.
type Process struct {
	PID  uint32
	Comm string

	Allocs     uint64 // successful allocation calls
	Frees      uint64 // frees of allocations this ledger saw
	Failed     uint64 // failed allocation calls
	AllocBytes uint64 // bytes of successful allocations

	// Frees of addresses the ledger never saw allocated: made before the
	// tracer attached, or a free of a bad pointer.
	UnknownFrees uint64
	// Allocations live when the trace began, made before it
	// (events.FlagBefore), and their bytes: live like the others, not
	// counted in Allocs and AllocBytes.
	BeforeAllocs, BeforeBytes uint64
	// Allocations returned at an address already live: the free in between
	// was lost. The older allocation is dropped from the live set.
	Replaced uint64

	Live, Peak         uint64 // GPU memory (every kind but pinned host)
	PeakTime           uint64 // when Peak was reached (boot ns)
	HostLive, HostPeak uint64 // pinned host memory

	// Tensors, the second level: blocks a framework's allocator hands out
	// of its segments (PyTorch's pytorch:malloc / pytorch:free), in the
	// bytes asked for, as memory_stats()'s requested_bytes counts them
	// (memory_allocated counts the blocks, rounded up). Segments are what
	// the fields above count: every allocator's, of which PyTorch's
	// memory_reserved is the share its caching allocator holds.
	TensorAllocs, TensorFrees uint64
	TensorAllocBytes          uint64
	TensorLive, TensorPeak    uint64
	TensorPeakTime            uint64
	UnknownTensorFrees        uint64

	// VMM virtual ranges (cuMemMap, cuMemAddressReserve). They hold no
	// memory of their own: the physical memory behind a mapping is counted
	// in Live from its cuMemCreate, and stays counted after cuMemRelease
	// for as long as it is mapped, as the driver keeps it.
	Mapped, MappedPeak uint64 // bytes mapped
	Reserved           uint64 // bytes of virtual address space reserved
	Maps, Unmaps       uint64 // successful cuMemMap calls; mappings cuMemUnmap removed
	FailedMaps         uint64
	UnknownUnmaps      uint64 // cuMemUnmap of a range with no mapping this ledger saw

	// Implicit frees: allocations the driver freed because their context
	// died (cuCtxDestroy, cuCtxDetach to 0, a primary context's last
	// release or reset, cudaDeviceReset), not counted in Frees.
	ImplicitFrees, ImplicitFreeBytes uint64

	// Held at exit: what the process still held when it ended (its last
	// thread exited, events.OpExit), released then, as the driver frees
	// it; not counted in Frees or ImplicitFrees. Allocs and bytes of GPU
	// memory (what Live counted), of pinned host memory, and of tensors.
	// Exited says it ended, at ExitTime (boot ns).
	Exited                            bool
	ExitTime                          uint64
	HeldAtExitAllocs, HeldAtExitBytes uint64
	HostHeldAtExit, TensorHeldAtExit  uint64
	// What was live at exit, by address: segments and tensors.
	heldAtExit, tensorsAtExit []*Allocation

	// The driver's contexts as this process's context records tell them:
	// each thread's (threadState) and each device's primary context.
	threads map[uint32]*threadState
	primary map[int32]uint64
	// lastTID's state is lastThread, the last one looked up: one map
	// look-up a record at most, none for a thread's records in a row.
	// A state once made stays in threads: the pointer stays good.
	lastTID    uint32
	lastThread *threadState

	Devices  map[int32]*Device
	Failures []Failure // the first Ledger.MaxFailures failed calls
	live     map[uint64]*Allocation
	tensors  map[uint64]*Allocation
	// lastDev is the device of the last device look-up: a process
	// allocates on one device, most often (device).
	lastDev *Device
	// VMM memory released while still mapped: live until its last unmap,
	// but no longer known by its handle, which the driver may hand out
	// again.
	released map[*Allocation]struct{}
	mappings map[uint64]*Mapping
	reserves map[uint64]uint64
}

// threadState is what one thread's records told of it. Kept together, one
// look-up a record: three maps by thread (its context, whether it ran
// before tracing, its untold allocations) took a look-up or an update each
// at every allocation and free of a thread that ran before tracing began.
type threadState struct {
	// ctx is its current context (0: none seen, the runtime's primary
	// context of its device).
	ctx uint64
	// before: it ran before tracing began (seen on the unknown device or
	// learning): with no context seen, its context is one set unseen.
	before bool
	// untold counts its untold allocations live (Allocation.Untold).
	untold int
}

// thread returns tid's state, made if it has none, to be written.
func (p *Process) thread(tid uint32) *threadState {
	if t := p.lastThread; t != nil && p.lastTID == tid {
		return t
	}
	t := p.threads[tid]
	if t == nil {
		t = &threadState{}
		p.threads[tid] = t
	}
	p.lastTID, p.lastThread = tid, t
	return t
}

// peekThread returns tid's state, or a zero one (not to be written) where
// it has none: a thread no record told anything of.
func (p *Process) peekThread(tid uint32) *threadState {
	if t := p.lastThread; t != nil && p.lastTID == tid {
		return t
	}
	t := p.threads[tid]
	if t == nil {
		return &noThread
	}
	p.lastTID, p.lastThread = tid, t
	return t
}

// noThread is peekThread's state of a thread with none: all zero, never
// written (callers write through thread).
var noThread threadState

// Mapping is a live VMM mapping: Size bytes of a handle's physical memory
// at virtual address Addr.
type Mapping struct {
	Addr, Size uint64
	Handle     uint64
	Device     int32       // the physical memory's device
	Alloc      *Allocation // the cuMemCreate behind it; nil if made before tracing began
	Time       uint64
}

// Stack is the stack of the cuMemCreate behind m; nil if it was made
// before tracing began.
func (m *Mapping) Stack() *Stack {
	if m.Alloc == nil {
		return nil
	}
	return m.Alloc.Stack
}

// Device is one process's use of one GPU.
type Device struct {
	Device                 int32
	Live, Peak             uint64
	TensorLive, TensorPeak uint64
	// Allocations (GPU and host) freed with their context, and their bytes.
	ImplicitFrees, ImplicitFreeBytes uint64
	// GPU allocations and bytes the process held on this device when it
	// ended (Process.HeldAtExitAllocs), and tensor bytes.
	HeldAtExitAllocs, HeldAtExitBytes uint64
	TensorHeldAtExit                  uint64
}

// Unknown reports whether d stands for the memory of threads whose device
// was not known when they allocated (events.DeviceUnknown).
func (d *Device) Unknown() bool { return d.Device == events.DeviceUnknown }

// Allocation is a live allocation.
type Allocation struct {
	Addr, Size uint64
	Device     int32
	API        events.API
	Time       uint64 // when it took effect (return of the call)
	TID        uint32
	Stack      *Stack
	// Ctx is the driver context it was made in, which frees it when it
	// dies; 0 where the thread had no context call seen (the runtime's
	// primary context of Device).
	Ctx uint64
	// Before: live when the trace began, made before it (events.FlagBefore).
	Before bool

	// untold: made while its thread's current context was one set before
	// tracing began and not named since (Ctx 0): the thread's own calls may
	// still name it (learnContext).
	untold   bool
	mapped   int  // VMM: live mappings of this physical memory
	released bool // VMM: cuMemRelease was called while it was mapped
}

// Untold reports whether a was made in a context set before tracing began
// that its thread has not named yet: the context that frees it is not
// known (record's learning keeps the probes that may tell it on).
func (a *Allocation) Untold() bool { return a.untold }

// Released reports whether a is VMM memory whose handle was released while
// it was mapped: it lives until its last mapping goes.
func (a *Allocation) Released() bool { return a.released }

// Mapped reports whether a is VMM memory (cuMemCreate) mapped at some
// virtual address now: its Addr is a handle, and only its mappings
// (Process.Mappings) say where it is.
func (a *Allocation) Mapped() bool { return a.mapped > 0 }

// Failure is a failed allocation call.
type Failure struct {
	Time   uint64
	TID    uint32
	API    events.API
	Size   uint64
	Device int32
	Result int32
	Stack  *Stack
}

// Stack aggregates the allocations made from one call stack of one process.
type Stack struct {
	PID        uint32
	Tensor     bool // the stack of tensor allocations (a framework's allocator)
	Frames     []uint64
	Allocs     uint64
	AllocBytes uint64
	Live       uint64 // bytes still live (GPU and host)
	LiveCount  uint64
	// Bytes and allocations still live when their process ended (held at
	// exit): released from Live then.
	HeldAtExit, HeldAtExitCount uint64
}

type stackKey struct {
	pid    uint32
	hash   uint64
	n      int
	tensor bool
}

// DefaultMaxFailures bounds the failures kept per process: a job retrying a
// failing allocation in a loop must not grow the ledger without end. All
// failures are still counted.
const DefaultMaxFailures = 10000

// New returns an empty ledger.
func New() *Ledger {
	return &Ledger{
		procs:    make(map[uint32]*Process),
		stacks:   make(map[stackKey]*Stack),
		seed:     maphash.MakeSeed(),
		maxFails: DefaultMaxFailures,
	}
}

func (l *Ledger) proc(pid uint32, comm string) *Process {
	p := l.last
	if p == nil || p.PID != pid {
		p = l.procs[pid]
	}
	if p == nil {
		p = &Process{PID: pid, Devices: make(map[int32]*Device), live: make(map[uint64]*Allocation),
			tensors: make(map[uint64]*Allocation), released: make(map[*Allocation]struct{}),
			mappings: make(map[uint64]*Mapping), reserves: make(map[uint64]uint64),
			threads: make(map[uint32]*threadState), primary: make(map[int32]uint64)}
		l.procs[pid] = p
	}
	l.last = p
	if comm != "" {
		p.Comm = comm // the latest: a process that exec'd is known by its new name
	}
	return p
}

func (p *Process) device(d int32) *Device {
	if dv := p.lastDev; dv != nil && dv.Device == d {
		return dv
	}
	dv := p.Devices[d]
	if dv == nil {
		dv = &Device{Device: d}
		p.Devices[d] = dv
	}
	p.lastDev = dv
	return dv
}

func (l *Ledger) stack(pid uint32, frames []uint64, tensor bool) *Stack {
	// The last stack, when these are its frames, is the one the map
	// holds for them: it was found there by the same key (or put there
	// with it), and stacks leave the map only with their process
	// (Forget, which drops lastStack too).
	if s := l.lastStack; s != nil && s.PID == pid && s.Tensor == tensor && slices.Equal(s.Frames, frames) {
		return s
	}
	key := l.key(pid, frames)
	key.tensor = tensor
	s := l.stacks[key]
	if s == nil {
		// Copy: the caller's slice is a reused decode buffer.
		s = &Stack{PID: pid, Frames: append([]uint64(nil), frames...), Tensor: tensor}
		l.stacks[key] = s
	}
	l.lastStack = s
	return s
}

// StackOf returns the ledger's aggregate for pid's stack frames (of
// tensor allocations, or of the others), or nil if no allocation came from
// it. Readers use it to attach what they know of a stack (the process's
// mappings at the time) to the aggregate.
func (l *Ledger) StackOf(pid uint32, frames []uint64, tensor bool) *Stack {
	key := l.key(pid, frames)
	key.tensor = tensor
	return l.stacks[key]
}

func (l *Ledger) key(pid uint32, frames []uint64) stackKey {
	// The frames' own memory hashed in one call, not a copy of them made
	// into bytes at each allocation (a Write per frame cost as much as the
	// rest of an allocation's accounting). The seed is the ledger's own,
	// so a hash is never compared with another ledger's or kept: the
	// host's byte order does not matter.
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(frames))), len(frames)*8)
	return stackKey{pid: pid, hash: maphash.Bytes(l.seed, b), n: len(frames)}
}

// Change is what Apply did to the ledger, for readers that follow it event
// by event (the exports' timelines) rather than only read its end state.
type Change struct {
	Process *Process    // nil for events that touch no process's account
	Stack   *Stack      // an allocation call's stack aggregate, failed calls' too
	Alloc   *Allocation // the allocation made, now live
	// Freed is the allocation a free released, or the one an allocation at
	// its address displaced (its free was lost).
	Freed *Allocation
	// AlsoFreed are further allocations the event released: a cuMemUnmap
	// of a range over several mappings whose memory was already released,
	// or a context's allocations after its first.
	AlsoFreed []*Allocation
	// Mapped is the VMM mapping a cuMemMap made. Unmapped are the mappings
	// a cuMemUnmap removed, by address, or the one a cuMemMap at its
	// address displaced (its unmap was lost). Physical memory (cuMemCreate)
	// has no address: these are where it is.
	Mapped   *Mapping
	Unmapped []*Mapping
	// Implicit: the allocations freed went with their context (OpContextEnd).
	Implicit bool
	// Exit: the process ended; the allocations freed are what it held at
	// exit (OpExit), tensors among them.
	Exit bool
}

// AllFreed yields Freed and every AlsoFreed.
func (c *Change) AllFreed() iter.Seq[*Allocation] {
	return func(yield func(*Allocation) bool) {
		if c.Freed == nil || !yield(c.Freed) {
			return
		}
		for _, a := range c.AlsoFreed {
			if !yield(a) {
				return
			}
		}
	}
}

// Apply accounts for one event and says what changed.
func (l *Ledger) Apply(ev *events.Event) Change {
	info := ev.API.Info()
	switch info.Op {
	case events.OpAlloc:
		return l.alloc(ev, info)
	case events.OpFree:
		return l.free(ev)
	}
	return l.applyOther(ev, info)
}

// applyOther is Apply for the records neither allocations nor frees: apart,
// so that the frame of Apply, which every event enters, is small (with
// them inlined into it, it took 616 bytes of stack to set up and clear).
func (l *Ledger) applyOther(ev *events.Event, info events.APIInfo) Change {
	switch info.Op {
	case events.OpMap:
		return l.mapVMM(ev)
	case events.OpUnmap:
		return l.proc(ev.PID, ev.Comm).unmapVMM(ev)
	case events.OpReserve:
		p := l.proc(ev.PID, ev.Comm)
		if ev.OK() {
			if old, ok := p.reserves[ev.Addr]; ok { // its cuMemAddressFree was lost
				p.Reserved -= old
			}
			p.reserves[ev.Addr] = ev.Size
			p.Reserved += ev.Size
		}
		return Change{Process: p}
	case events.OpUnreserve:
		p := l.proc(ev.PID, ev.Comm)
		if size, ok := p.reserves[ev.Addr]; ok {
			delete(p.reserves, ev.Addr)
			p.Reserved -= size
		}
		return Change{Process: p}
	case events.OpContext:
		p := l.proc(ev.PID, ev.Comm)
		// A pop's record names the context current after it (addr ==
		// size), but where the thread popped a context set before tracing
		// began (its return probe, learning): that one (addr).
		popped := ev.API == events.CuCtxPopCurrent && ev.Addr != ev.Size
		t := p.thread(ev.TID)
		if popped || learns(ev.API) {
			t.before = true
		}
		if t.ctx == 0 {
			switch {
			case popped:
				p.learnContext(ev.TID, ev.Addr)
			case ev.Size != 0 && learns(ev.API):
				p.learnContext(ev.TID, ev.Size)
			case ev.API == events.CuCtxSetCurrent:
				// It replaced (or, NULL, popped) the context set unseen:
				// that one can no longer be named by the thread's calls.
				p.untoldLost(ev.TID)
			}
		}
		t.ctx = ev.Size
		if ev.API.PrimaryContext() && ev.Addr != 0 {
			p.primary[ev.Device] = ev.Addr
		}
		return Change{Process: p}
	case events.OpContextEnd:
		return l.proc(ev.PID, ev.Comm).contextEnd(ev)
	case events.OpExit:
		p := l.procs[ev.PID]
		if p == nil { // nothing traced of it: nothing to release
			return Change{}
		}
		return p.exit(ev)
	}
	return Change{}
}

// learns reports whether api's records tell a context that was current
// to the thread before the call too (it changes nothing): what a thread
// that ran before tracing began says of its own state.
func learns(api events.API) bool {
	switch api {
	case events.CuCtxGetCurrent, events.CuCtxGetDevice, events.CudaGetDevice:
		return true
	}
	return false
}

// learnContext gives ctx, now learned to be the context tid had current
// since before tracing began (cuCtxGetCurrent says it, or cuCtxPopCurrent
// popped it), to the allocations tid made while it was unnamed (untold):
// they were made in it, and die with it. Their device stays what it was
// (unknown: never guessed after the fact). Learning records come once per
// thread, when they tell something new.
func (p *Process) learnContext(tid uint32, ctx uint64) {
	t := p.peekThread(tid)
	if t.untold == 0 {
		return
	}
	for _, a := range p.live {
		if a.TID == tid && a.untold {
			a.Ctx, a.untold = ctx, false
		}
	}
	t.untold = 0
}

// untoldLost: tid's context set before tracing is no longer current
// (cuCtxSetCurrent replaced it), so no call of tid's can name it now; its
// untold allocations keep Ctx 0.
func (p *Process) untoldLost(tid uint32) {
	t := p.peekThread(tid)
	if t.untold == 0 {
		return
	}
	for _, a := range p.live {
		if a.TID == tid {
			a.untold = false
		}
	}
	t.untold = 0
}

// Untold reports whether thread tid has live allocations made in a
// context set before tracing began that it has not named yet.
func (p *Process) Untold(tid uint32) bool { return p.peekThread(tid).untold > 0 }

// contextEnd frees what was allocated in the context that died: for a
// created context, the allocations made in it; for a device's primary
// context, those made in it and those made where no context call was
// seen on that device (the runtime's). VMM memory (cuMemCreate) is the
// process's, not a context's, and stays.
func (p *Process) contextEnd(ev *events.Event) Change {
	p.thread(ev.TID).ctx = ev.Size
	primary := ev.API.PrimaryContext()
	handle := ev.Addr
	if primary && handle == 0 {
		handle = p.primary[ev.Device]
	}
	dies := func(a *Allocation) bool {
		if a.API == events.CuMemCreate {
			return false
		}
		if handle != 0 && a.Ctx == handle {
			return true
		}
		return primary && a.Device == ev.Device && (a.Ctx == 0 || a.Ctx == p.primary[ev.Device])
	}
	var freed []*Allocation
	for _, a := range p.live {
		if dies(a) {
			freed = append(freed, a)
		}
	}
	sortAllocs(freed)
	ch := Change{Process: p, Implicit: true}
	for i, a := range freed {
		p.release(a)
		p.ImplicitFrees++
		p.ImplicitFreeBytes += a.Size
		if a.API.Info().Kind != events.KindHost {
			d := p.device(a.Device)
			d.ImplicitFrees++
			d.ImplicitFreeBytes += a.Size
		}
		if i == 0 {
			ch.Freed = a
		} else {
			ch.AlsoFreed = append(ch.AlsoFreed, a)
		}
	}
	return ch
}

// exit ends p: what it still holds becomes its held-at-exit figures, per
// process and device, kept for the reports, and leaves every live total:
// the driver frees a process's memory when it ends. VMM mappings and
// reserved ranges, which hold no memory of their own, stay as they were
// at its end, for the reports. A second exit (two threads ending at once) finds
// nothing left.
func (p *Process) exit(ev *events.Event) Change {
	ch := Change{Process: p, Exit: true}
	if p.Exited {
		return ch
	}
	p.Exited, p.ExitTime = true, ev.End()
	segs, tensors := p.LiveAllocations(), p.LiveTensors()
	p.heldAtExit, p.tensorsAtExit = segs, tensors
	for _, a := range segs {
		d := p.device(a.Device)
		switch {
		case a.API.Info().Kind == events.KindHost:
			p.HostHeldAtExit += a.Size
		default:
			p.HeldAtExitAllocs++
			p.HeldAtExitBytes += a.Size
			d.HeldAtExitAllocs++
			d.HeldAtExitBytes += a.Size
		}
		if a.released {
			delete(p.released, a)
			p.account(a)
		} else {
			p.release(a)
		}
	}
	for _, a := range tensors {
		p.TensorHeldAtExit += a.Size
		p.device(a.Device).TensorHeldAtExit += a.Size
		p.tensorRelease(a)
	}
	for _, a := range slices.Concat(segs, tensors) {
		a.Stack.HeldAtExit += a.Size
		a.Stack.HeldAtExitCount++
		if ch.Freed == nil {
			ch.Freed = a
		} else {
			ch.AlsoFreed = append(ch.AlsoFreed, a)
		}
	}
	return ch
}

// AtEnd returns what p held at its end, segments and tensors by address:
// its live sets while it runs, what it held at exit once it ended. The
// reports' "live at end" views (leak candidates, profiles, snapshots)
// read this, so that an exited process still names what it left.
func (p *Process) AtEnd() (segs, tensors []*Allocation) {
	if p.Exited {
		return slices.Clone(p.heldAtExit), slices.Clone(p.tensorsAtExit)
	}
	return p.LiveAllocations(), p.LiveTensors()
}

func (l *Ledger) alloc(ev *events.Event, info events.APIInfo) Change {
	p := l.proc(ev.PID, ev.Comm)
	if info.Layer == events.LayerTensor {
		return l.tensorAlloc(p, ev)
	}
	st := l.stack(ev.PID, ev.Stack, false)
	ch := Change{Process: p, Stack: st}
	if !ev.OK() {
		p.Failed++
		if len(p.Failures) < l.maxFails {
			p.Failures = append(p.Failures, Failure{Time: ev.End(), TID: ev.TID, API: ev.API, Size: ev.Size,
				Device: ev.Device, Result: ev.Result, Stack: st})
		}
		return ch
	}
	if ev.Flags&events.FlagBefore != 0 {
		p.BeforeAllocs++
		p.BeforeBytes += ev.Size
	} else {
		p.Allocs++
		p.AllocBytes += ev.Size
	}
	if old := p.live[ev.Addr]; old != nil {
		p.Replaced++
		p.release(old)
		ch.Freed = old
	}
	a := p.place(ev, st, p.live, &ch)
	t := p.peekThread(ev.TID)
	if ev.Device == events.DeviceUnknown && !t.before {
		t = p.thread(ev.TID)
		t.before = true
	}
	if a.Ctx == 0 && t.before && ev.API != events.CuMemCreate { // VMM memory is no context's
		a.untold = true
		t.untold++ // t is the thread's own: before is set only there
	}
	if info.Kind == events.KindHost {
		grow(&p.HostLive, &p.HostPeak, nil, a)
		return ch
	}
	grow(&p.Live, &p.Peak, &p.PeakTime, a)
	d := p.device(a.Device)
	grow(&d.Live, &d.Peak, nil, a)
	return ch
}

// place makes ev's allocation from stack st, live in live (p.live or
// p.tensors), as ch's.
func (p *Process) place(ev *events.Event, st *Stack, live map[uint64]*Allocation, ch *Change) *Allocation {
	// Made before the trace began (the agent's windows start with its live
	// set): live, but not an allocation of this trace's.
	before := ev.Flags&events.FlagBefore != 0
	if !before {
		st.Allocs++
		st.AllocBytes += ev.Size
	}
	a := &Allocation{Addr: ev.Addr, Size: ev.Size, Device: ev.Device, API: ev.API, Time: ev.End(), TID: ev.TID, Stack: st,
		Ctx: p.peekThread(ev.TID).ctx, Before: before}
	ch.Alloc = a
	live[ev.Addr] = a
	st.Live += a.Size
	st.LiveCount++
	return a
}

// grow adds a's bytes to a live count and raises its peak, noting when in
// *peakTime (nil: not kept).
func grow(live, peak, peakTime *uint64, a *Allocation) {
	*live += a.Size
	if *live > *peak {
		*peak = *live
		if peakTime != nil {
			*peakTime = a.Time
		}
	}
}

func (l *Ledger) free(ev *events.Event) Change {
	p := l.proc(ev.PID, ev.Comm)
	if ev.API.Info().Layer == events.LayerTensor {
		return p.tensorFree(ev)
	}
	a := p.live[ev.Addr]
	if a == nil {
		p.UnknownFrees++
		return Change{Process: p}
	}
	p.Frees++
	if a.mapped > 0 { // cuMemRelease of mapped memory: it lives until unmapped
		delete(p.live, a.Addr)
		a.released = true
		p.released[a] = struct{}{}
		return Change{Process: p}
	}
	p.release(a)
	return Change{Process: p, Freed: a}
}

// mapVMM records a cuMemMap: the handle's physical memory (ev.Aux) at
// virtual address ev.Addr.
func (l *Ledger) mapVMM(ev *events.Event) Change {
	p := l.proc(ev.PID, ev.Comm)
	if !ev.OK() {
		p.FailedMaps++
		return Change{Process: p}
	}
	ch := Change{Process: p}
	if old := p.mappings[ev.Addr]; old != nil { // its cuMemUnmap was lost
		ch.Unmapped = append(ch.Unmapped, old)
		if a := p.unmapOne(old); a != nil {
			ch.Freed = a
		}
	}
	m := &Mapping{Addr: ev.Addr, Size: ev.Size, Handle: ev.Aux, Device: ev.Device, Time: ev.End()}
	if a := p.live[ev.Aux]; a != nil {
		m.Alloc, m.Device = a, a.Device
		a.mapped++
	}
	p.mappings[ev.Addr] = m
	ch.Mapped = m
	p.Maps++
	p.Mapped += m.Size
	p.MappedPeak = max(p.MappedPeak, p.Mapped)
	return ch
}

// unmapVMM removes the mappings that start in [ev.Addr, ev.Addr+ev.Size):
// cuMemUnmap takes whole mappings, and one call may cover several.
func (p *Process) unmapVMM(ev *events.Event) Change {
	ch := Change{Process: p}
	var gone []*Mapping
	if m := p.mappings[ev.Addr]; m != nil && m.Size >= ev.Size {
		gone = append(gone, m) // the common case: one call per mapping
	} else {
		for _, m := range p.mappings {
			if m.Addr >= ev.Addr && m.Addr-ev.Addr < ev.Size {
				gone = append(gone, m)
			}
		}
		slices.SortFunc(gone, func(a, b *Mapping) int { return cmp.Compare(a.Addr, b.Addr) })
	}
	if len(gone) == 0 {
		p.UnknownUnmaps++
		return ch
	}
	ch.Unmapped = gone
	for _, m := range gone {
		a := p.unmapOne(m)
		switch {
		case a == nil:
		case ch.Freed == nil:
			ch.Freed = a
		default:
			ch.AlsoFreed = append(ch.AlsoFreed, a)
		}
	}
	return ch
}

// unmapOne removes m and returns the physical memory it was the last hold
// on, if that memory had been released.
func (p *Process) unmapOne(m *Mapping) *Allocation {
	delete(p.mappings, m.Addr)
	p.Unmaps++
	p.Mapped -= m.Size
	a := m.Alloc
	if a == nil {
		return nil
	}
	a.mapped--
	if a.mapped > 0 || !a.released {
		return nil
	}
	delete(p.released, a)
	p.account(a)
	return a
}

func (l *Ledger) tensorAlloc(p *Process, ev *events.Event) Change {
	st := l.stack(ev.PID, ev.Stack, true)
	ch := Change{Process: p, Stack: st}
	if ev.Flags&events.FlagBefore == 0 {
		p.TensorAllocs++
		p.TensorAllocBytes += ev.Size
	}
	if old := p.tensors[ev.Addr]; old != nil {
		p.tensorRelease(old)
		ch.Freed = old
	}
	a := p.place(ev, st, p.tensors, &ch)
	grow(&p.TensorLive, &p.TensorPeak, &p.TensorPeakTime, a)
	d := p.device(a.Device)
	grow(&d.TensorLive, &d.TensorPeak, nil, a)
	return ch
}

func (p *Process) tensorFree(ev *events.Event) Change {
	a := p.tensors[ev.Addr]
	if a == nil {
		p.UnknownTensorFrees++
		return Change{Process: p}
	}
	p.TensorFrees++
	p.tensorRelease(a)
	return Change{Process: p, Freed: a}
}

func (p *Process) tensorRelease(a *Allocation) {
	delete(p.tensors, a.Addr)
	a.Stack.Live -= a.Size
	a.Stack.LiveCount--
	p.TensorLive -= a.Size
	p.device(a.Device).TensorLive -= a.Size
}

// release removes a from the live set and every total it counts in.
func (p *Process) release(a *Allocation) {
	delete(p.live, a.Addr)
	if a.untold {
		a.untold = false
		if t := p.peekThread(a.TID); t.untold > 0 { // an untold allocation's thread has a state
			t.untold--
		}
	}
	p.account(a)
}

// account takes a's bytes off every total it counts in.
func (p *Process) account(a *Allocation) {
	a.Stack.Live -= a.Size
	a.Stack.LiveCount--
	if a.API.Info().Kind == events.KindHost {
		p.HostLive -= a.Size
		return
	}
	p.Live -= a.Size
	p.device(a.Device).Live -= a.Size
}

// Processes returns every process seen, by PID.
func (l *Ledger) Processes() []*Process {
	return slices.SortedFunc(maps.Values(l.procs), func(a, b *Process) int { return cmp.Compare(a.PID, b.PID) })
}

// Process returns one process's account, or nil.
func (l *Ledger) Process(pid uint32) *Process { return l.procs[pid] }

// Stacks returns every distinct allocation stack, most live bytes first,
// then most allocated bytes, then by PID, call count and addresses: a total
// order, so the same events always list the same way.
func (l *Ledger) Stacks() []*Stack {
	out := make([]*Stack, 0, len(l.stacks))
	for _, s := range l.stacks {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *Stack) int {
		return cmp.Or(cmp.Compare(b.Live, a.Live), cmp.Compare(b.AllocBytes, a.AllocBytes),
			cmp.Compare(a.PID, b.PID), cmp.Compare(b.Allocs, a.Allocs), slices.Compare(a.Frames, b.Frames))
	})
	return out
}

// LiveTensors returns p's live tensor allocations by address.
func (p *Process) LiveTensors() []*Allocation { return byAddress(p.tensors) }

// LiveAllocations returns p's live allocations by address (segments: the
// runtime's and the driver's), VMM memory released but still mapped
// included.
func (p *Process) LiveAllocations() []*Allocation {
	out := byAddress(p.live)
	if len(p.released) == 0 {
		return out
	}
	for a := range p.released {
		out = append(out, a)
	}
	sortAllocs(out)
	return out
}

// LiveCount is len(p.LiveAllocations()), without building the list.
func (p *Process) LiveCount() int { return len(p.live) + len(p.released) }

// Mappings returns p's live VMM mappings by virtual address.
func (p *Process) Mappings() []*Mapping {
	out := make([]*Mapping, 0, len(p.mappings))
	for _, m := range p.mappings {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b *Mapping) int { return cmp.Compare(a.Addr, b.Addr) })
	return out
}

func byAddress(m map[uint64]*Allocation) []*Allocation {
	out := make([]*Allocation, 0, len(m))
	for _, a := range m {
		out = append(out, a)
	}
	sortAllocs(out)
	return out
}

// sortAllocs orders by address, then time: a handle the driver reused
// while the memory it named was still mapped appears twice.
func sortAllocs(out []*Allocation) {
	slices.SortFunc(out, func(a, b *Allocation) int {
		return cmp.Or(cmp.Compare(a.Addr, b.Addr), cmp.Compare(a.Time, b.Time))
	})
}

// DeviceList returns p's devices by ordinal.
func (p *Process) DeviceList() []*Device {
	return slices.SortedFunc(maps.Values(p.Devices), func(a, b *Device) int { return cmp.Compare(a.Device, b.Device) })
}

// Forget drops pid's account and its stacks from the ledger, for a ledger
// that runs for good (the agent) and must not keep every process it ever
// saw. Stacks and allocations handed out before stay valid for their
// holders; the ledger no longer counts into them. A later event of pid
// starts a new account.
func (l *Ledger) Forget(pid uint32) {
	if _, ok := l.procs[pid]; !ok {
		return
	}
	delete(l.procs, pid)
	if l.last != nil && l.last.PID == pid {
		l.last = nil
	}
	if l.lastStack != nil && l.lastStack.PID == pid {
		l.lastStack = nil
	}
	for k := range l.stacks {
		if k.pid == pid {
			delete(l.stacks, k)
		}
	}
}
