package events

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sort"
)

// Ledger keeps what each process holds: live allocations keyed by address,
// per-process and per-device totals with their peaks, failures, and
// allocation stacks. Apply it to events in the order the ring buffer
// delivered them; the BPF programs order frees before any reuse of their
// address (see bpf/cudatrace.bpf.c).
type Ledger struct {
	procs    map[uint32]*Process
	stacks   map[stackKey]*Stack
	seed     maphash.Seed
	maxFails int
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
	// Allocations returned at an address already live: the free in between
	// was lost. The older allocation is dropped from the live set.
	Replaced uint64

	Live, Peak         uint64 // GPU memory (every kind but pinned host)
	PeakTime           uint64 // when Peak was reached (boot ns)
	HostLive, HostPeak uint64 // pinned host memory

	// Tensors, the second level: blocks a framework's allocator hands out
	// of its segments (PyTorch's pytorch:malloc / pytorch:free), as
	// torch.cuda.memory_allocated counts them. Segments are what the fields
	// above count, as memory_reserved does.
	TensorAllocs, TensorFrees uint64
	TensorAllocBytes          uint64
	TensorLive, TensorPeak    uint64
	TensorPeakTime            uint64
	UnknownTensorFrees        uint64

	Devices  map[int32]*Device
	Failures []Failure // the first Ledger.MaxFailures failed calls
	live     map[uint64]*Allocation
	tensors  map[uint64]*Allocation
}

// Device is one process's use of one GPU.
type Device struct {
	Device                 int32
	Live, Peak             uint64
	TensorLive, TensorPeak uint64
}

// Allocation is a live allocation.
type Allocation struct {
	Addr, Size uint64
	Device     int32
	API        API
	Time       uint64 // when it took effect (return of the call)
	TID        uint32
	Stack      *Stack
}

// Failure is a failed allocation call.
type Failure struct {
	Time   uint64
	TID    uint32
	API    API
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

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{
		procs:    make(map[uint32]*Process),
		stacks:   make(map[stackKey]*Stack),
		seed:     maphash.MakeSeed(),
		maxFails: DefaultMaxFailures,
	}
}

func (l *Ledger) proc(pid uint32, comm string) *Process {
	p := l.procs[pid]
	if p == nil {
		p = &Process{PID: pid, Devices: make(map[int32]*Device), live: make(map[uint64]*Allocation),
			tensors: make(map[uint64]*Allocation)}
		l.procs[pid] = p
	}
	if comm != "" {
		p.Comm = comm // the latest: a process that exec'd is known by its new name
	}
	return p
}

func (p *Process) device(d int32) *Device {
	dv := p.Devices[d]
	if dv == nil {
		dv = &Device{Device: d}
		p.Devices[d] = dv
	}
	return dv
}

func (l *Ledger) stack(pid uint32, frames []uint64, tensor bool) *Stack {
	key := l.key(pid, frames)
	key.tensor = tensor
	s := l.stacks[key]
	if s == nil {
		// Copy: the caller's slice is a reused decode buffer.
		s = &Stack{PID: pid, Frames: append([]uint64(nil), frames...), Tensor: tensor}
		l.stacks[key] = s
	}
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
	var h maphash.Hash
	h.SetSeed(l.seed)
	var buf [8]byte
	for _, f := range frames {
		for i := range buf {
			buf[i] = byte(f >> (8 * i))
		}
		h.Write(buf[:])
	}
	return stackKey{pid: pid, hash: h.Sum64(), n: len(frames)}
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
}

// Apply accounts for one event and says what changed.
func (l *Ledger) Apply(ev *Event) Change {
	info := ev.API.Info()
	switch info.Op {
	case OpAlloc:
		return l.alloc(ev, info)
	case OpFree:
		return l.free(ev)
	}
	return Change{}
}

func (l *Ledger) alloc(ev *Event, info APIInfo) Change {
	p := l.proc(ev.PID, ev.Comm)
	if info.Layer == LayerTensor {
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
	p.Allocs++
	p.AllocBytes += ev.Size
	st.Allocs++
	st.AllocBytes += ev.Size
	if old := p.live[ev.Addr]; old != nil {
		p.Replaced++
		p.release(old)
		ch.Freed = old
	}
	a := &Allocation{Addr: ev.Addr, Size: ev.Size, Device: ev.Device, API: ev.API, Time: ev.End(), TID: ev.TID, Stack: st}
	ch.Alloc = a
	p.live[ev.Addr] = a
	st.Live += a.Size
	st.LiveCount++
	if info.Kind == KindHost {
		p.HostLive += a.Size
		p.HostPeak = max(p.HostPeak, p.HostLive)
		return ch
	}
	p.Live += a.Size
	if p.Live > p.Peak {
		p.Peak = p.Live
		p.PeakTime = a.Time
	}
	d := p.device(a.Device)
	d.Live += a.Size
	d.Peak = max(d.Peak, d.Live)
	return ch
}

func (l *Ledger) free(ev *Event) Change {
	p := l.proc(ev.PID, ev.Comm)
	if ev.API.Info().Layer == LayerTensor {
		return p.tensorFree(ev)
	}
	a := p.live[ev.Addr]
	if a == nil {
		p.UnknownFrees++
		return Change{Process: p}
	}
	p.Frees++
	p.release(a)
	return Change{Process: p, Freed: a}
}

func (l *Ledger) tensorAlloc(p *Process, ev *Event) Change {
	st := l.stack(ev.PID, ev.Stack, true)
	ch := Change{Process: p, Stack: st}
	p.TensorAllocs++
	p.TensorAllocBytes += ev.Size
	st.Allocs++
	st.AllocBytes += ev.Size
	if old := p.tensors[ev.Addr]; old != nil {
		p.tensorRelease(old)
		ch.Freed = old
	}
	a := &Allocation{Addr: ev.Addr, Size: ev.Size, Device: ev.Device, API: ev.API, Time: ev.End(), TID: ev.TID, Stack: st}
	ch.Alloc = a
	p.tensors[ev.Addr] = a
	st.Live += a.Size
	st.LiveCount++
	p.TensorLive += a.Size
	if p.TensorLive > p.TensorPeak {
		p.TensorPeak = p.TensorLive
		p.TensorPeakTime = a.Time
	}
	d := p.device(a.Device)
	d.TensorLive += a.Size
	d.TensorPeak = max(d.TensorPeak, d.TensorLive)
	return ch
}

func (p *Process) tensorFree(ev *Event) Change {
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
	a.Stack.Live -= a.Size
	a.Stack.LiveCount--
	if a.API.Info().Kind == KindHost {
		p.HostLive -= a.Size
		return
	}
	p.Live -= a.Size
	p.device(a.Device).Live -= a.Size
}

// Processes returns every process seen, by PID.
func (l *Ledger) Processes() []*Process {
	out := make([]*Process, 0, len(l.procs))
	for _, p := range l.procs {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out
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
// runtime's and the driver's).
func (p *Process) LiveAllocations() []*Allocation { return byAddress(p.live) }

func byAddress(m map[uint64]*Allocation) []*Allocation {
	out := make([]*Allocation, 0, len(m))
	for _, a := range m {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr < out[j].Addr })
	return out
}

// DeviceList returns p's devices by ordinal.
func (p *Process) DeviceList() []*Device {
	out := make([]*Device, 0, len(p.Devices))
	for _, d := range p.Devices {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Device < out[j].Device })
	return out
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
	for k := range l.stacks {
		if k.pid == pid {
			delete(l.stacks, k)
		}
	}
}
