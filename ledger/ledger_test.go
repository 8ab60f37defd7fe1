package ledger

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

func alloc(pid uint32, api events.API, addr, size uint64, dev int32, frames ...uint64) *events.Event {
	return &events.Event{PID: pid, TID: pid, Comm: "w", API: api, Addr: addr, Size: size, Device: dev, Stack: frames}
}

func free(pid uint32, api events.API, addr uint64) *events.Event {
	return &events.Event{PID: pid, TID: pid, Comm: "w", API: api, Addr: addr, Flags: events.FlagEntryOnly}
}

func TestLedgerTotals(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 100, 0, 0xa))
	l.Apply(alloc(1, events.CudaMallocManaged, 0x2000, 50, 1, 0xb))
	l.Apply(alloc(1, events.CudaMallocHost, 0x9000, 70, 0, 0xa))
	l.Apply(&events.Event{PID: 1, API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{0xc}})
	l.Apply(free(1, events.CudaFree, 0x1000))
	l.Apply(free(1, events.CudaFree, 0x5555))                // never seen
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 30, 1, 0xa)) // address reused

	p := l.Process(1)
	checks := map[string][2]uint64{
		"allocs":       {p.Allocs, 4},
		"frees":        {p.Frees, 1},
		"failed":       {p.Failed, 1},
		"alloc_bytes":  {p.AllocBytes, 250},
		"live":         {p.Live, 80},
		"peak":         {p.Peak, 150},
		"host_live":    {p.HostLive, 70},
		"unknown_free": {p.UnknownFrees, 1},
		"replaced":     {p.Replaced, 0},
	}
	for name, c := range checks {
		if c[0] != c[1] {
			t.Errorf("%s = %d, want %d", name, c[0], c[1])
		}
	}
	devs := p.DeviceList()
	if len(devs) != 2 || devs[0].Live != 0 || devs[0].Peak != 100 || devs[1].Live != 80 || devs[1].Peak != 80 {
		t.Errorf("devices %+v %+v", *devs[0], *devs[1])
	}
	if len(p.Failures) != 1 || p.Failures[0].Result != 2 || p.Failures[0].Size != 1<<40 {
		t.Errorf("failures %+v", p.Failures)
	}
	stacks := l.Stacks()
	// 0xa: 100 (freed) + 70 host + 30 = 3 allocs, 100 live; 0xb: 50 live; 0xc: failure only.
	if len(stacks) != 3 || stacks[0].Frames[0] != 0xa || stacks[0].Allocs != 3 || stacks[0].Live != 100 ||
		stacks[0].AllocBytes != 200 || stacks[1].Frames[0] != 0xb || stacks[1].Live != 50 {
		for _, s := range stacks {
			t.Logf("%+v", *s)
		}
		t.Fatal("stacks wrong")
	}
}

func TestLedgerLostFreeReplaces(t *testing.T) {
	l := New()
	l.Apply(alloc(7, events.CudaMalloc, 0x1000, 100, 0))
	l.Apply(alloc(7, events.CudaMalloc, 0x1000, 40, 0)) // the free in between was lost
	p := l.Process(7)
	if p.Replaced != 1 || p.Live != 40 || p.Allocs != 2 || len(p.LiveAllocations()) != 1 {
		t.Fatalf("replaced %d live %d allocs %d", p.Replaced, p.Live, p.Allocs)
	}
}

func TestLedgerFailuresBounded(t *testing.T) {
	l := New()
	l.maxFails = 3
	for i := 0; i < 10; i++ {
		l.Apply(&events.Event{PID: 1, API: events.CudaMalloc, Size: 1, Result: 2})
	}
	p := l.Process(1)
	if p.Failed != 10 || len(p.Failures) != 3 {
		t.Fatalf("failed %d kept %d", p.Failed, len(p.Failures))
	}
}

func TestLedgerPerProcess(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 10, 0))
	l.Apply(alloc(2, events.CudaMalloc, 0x1000, 20, 0)) // same address, other process: not a reuse
	if l.Process(1).Live != 10 || l.Process(2).Live != 20 || l.Process(1).Replaced != 0 {
		t.Fatal("processes share state")
	}
	if ps := l.Processes(); len(ps) != 2 || ps[0].PID != 1 {
		t.Fatal("order")
	}
}

// Apply says what it did: readers that follow the ledger (the exports'
// timelines) rely on it instead of diffing the ledger.
func TestLedgerChange(t *testing.T) {
	l := New()
	ch := l.Apply(alloc(1, events.CudaMalloc, 0x1000, 100, 2, 0xa))
	if ch.Process != l.Process(1) || ch.Alloc == nil || ch.Freed != nil || ch.Stack == nil {
		t.Fatalf("alloc: %+v", ch)
	}
	if a := ch.Alloc; a.Addr != 0x1000 || a.Size != 100 || a.Device != 2 || a.Stack != ch.Stack || ch.Stack.Frames[0] != 0xa {
		t.Errorf("alloc: %+v, stack %+v", a, ch.Stack)
	}
	first := ch.Alloc

	ch = l.Apply(&events.Event{PID: 1, API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{0xc}})
	if ch.Alloc != nil || ch.Freed != nil || ch.Stack == nil || ch.Stack.Frames[0] != 0xc {
		t.Errorf("failed call: %+v", ch)
	}

	// An allocation at a live address displaces the older one.
	ch = l.Apply(alloc(1, events.CudaMalloc, 0x1000, 30, 0, 0xb))
	if ch.Freed != first || ch.Alloc == nil || ch.Alloc.Size != 30 {
		t.Errorf("replacing alloc: %+v", ch)
	}
	second := ch.Alloc

	ch = l.Apply(free(1, events.CudaFree, 0x1000))
	if ch.Freed != second || ch.Alloc != nil || ch.Stack != nil {
		t.Errorf("free: %+v", ch)
	}
	ch = l.Apply(free(1, events.CudaFree, 0x1000)) // already freed
	if ch.Process == nil || ch.Freed != nil {
		t.Errorf("unknown free: %+v", ch)
	}
	if ch = l.Apply(&events.Event{PID: 1, API: events.CudaSetDevice}); ch.Process != nil || ch.Alloc != nil || ch.Freed != nil || ch.AlsoFreed != nil {
		t.Errorf("set device: %+v", ch)
	}
}

// Tensors are a level of their own: their bytes never mix with the
// segments they are cut from, and their addresses (inside a segment) do not
// collide with the segment's.
func TestLedgerTensors(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 2<<20, 0, 0xa))
	ch := l.Apply(alloc(1, events.TorchMalloc, 0x1000, 100, 0, 0xb)) // at the segment's own address
	if ch.Alloc == nil || ch.Freed != nil || ch.Stack == nil || !ch.Stack.Tensor {
		t.Fatalf("tensor alloc: %+v", ch)
	}
	l.Apply(alloc(1, events.TorchMalloc, 0x1200, 300, 1, 0xb))
	l.Apply(free(1, events.TorchFree, 0x1000))
	l.Apply(free(1, events.TorchFree, 0x9999)) // never seen
	p := l.Process(1)
	got := []uint64{p.Allocs, p.Live, p.Peak, p.TensorAllocs, p.TensorFrees, p.TensorAllocBytes, p.TensorLive,
		p.TensorPeak, p.UnknownTensorFrees, p.UnknownFrees, p.Devices[1].TensorLive, p.Devices[0].TensorPeak}
	want := []uint64{1, 2 << 20, 2 << 20, 2, 1, 400, 300, 400, 1, 0, 300, 100}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("field %d = %d, want %d (all: %v)", i, got[i], want[i], got)
		}
	}
	if n := len(p.LiveAllocations()); n != 1 {
		t.Errorf("%d live segments, want 1", n)
	}
	if ts := p.LiveTensors(); len(ts) != 1 || ts[0].Addr != 0x1200 {
		t.Errorf("live tensors %+v", ts)
	}
	if l.StackOf(1, []uint64{0xb}, true) == nil || l.StackOf(1, []uint64{0xb}, false) != nil {
		t.Errorf("the tensor stack is not kept apart")
	}
	if events.TorchMalloc.Segment() || !events.CuMemCreate.Segment() || events.CudaMallocHost.Segment() || events.CudaSetDevice.Segment() {
		t.Errorf("Segment() wrong")
	}
}

// TestLedgerForget: a forgotten process leaves no account and no stacks; the
// others are untouched, and a later event of the same PID starts afresh.
func TestLedgerForget(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 100, 0, 0xa))
	l.Apply(alloc(1, events.TorchMalloc, 0x1000, 10, 0, 0xa))
	l.Apply(alloc(2, events.CudaMalloc, 0x1000, 7, 0, 0xa))
	l.Apply(&events.Event{PID: 1, API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{0xc}})
	if got := len(l.Stacks()); got != 4 {
		t.Fatalf("before: %d stacks, want 4", got)
	}
	l.Forget(1)
	l.Forget(99) // never seen: nothing happens
	if l.Process(1) != nil {
		t.Error("process 1 still has an account")
	}
	stacks := l.Stacks()
	if len(stacks) != 1 || stacks[0].PID != 2 || stacks[0].Live != 7 {
		t.Fatalf("after: stacks %v, want only pid 2's", stacks)
	}
	if p := l.Process(2); p == nil || p.Live != 7 || p.Allocs != 1 {
		t.Fatalf("process 2 = %+v", p)
	}
	l.Apply(alloc(1, events.CudaMalloc, 0x2000, 5, 0, 0xa))
	p := l.Process(1)
	if p.Allocs != 1 || p.Live != 5 || p.Peak != 5 || p.Failed != 0 {
		t.Errorf("process 1 after forget: allocs %d live %d peak %d failed %d, want 1 5 5 0", p.Allocs, p.Live, p.Peak, p.Failed)
	}
	if st := l.StackOf(1, []uint64{0xa}, false); st == nil || st.Allocs != 1 || st.Live != 5 {
		t.Errorf("pid 1's stack after forget: %+v, want 1 alloc of 5", st)
	}
}

func vmmMap(pid uint32, va, size, handle uint64) *events.Event {
	return &events.Event{PID: pid, TID: pid, Comm: "w", API: events.CuMemMap, Addr: va, Size: size, Aux: handle, Flags: events.FlagAux,
		Device: 5, Stack: []uint64{0xd}}
}

func sized(pid uint32, api events.API, addr, size uint64) *events.Event {
	ev := free(pid, api, addr)
	ev.Size = size
	return ev
}

// VMM memory counts from cuMemCreate until it is both released and
// unmapped, in either order, as the driver keeps it; mappings and
// reservations hold no memory of their own.
func TestLedgerVMM(t *testing.T) {
	l := New()
	l.Apply(&events.Event{PID: 1, API: events.CuMemAddressReserve, Addr: 0x7000_0000, Size: 1 << 30})
	l.Apply(alloc(1, events.CuMemCreate, 0xa1, 2<<20, 1, 0xa))
	l.Apply(alloc(1, events.CuMemCreate, 0xa2, 2<<20, 1, 0xa))
	l.Apply(alloc(1, events.CuMemCreate, 0xa3, 4<<20, 0, 0xb))
	// Each map says where its physical memory now is, for readers that
	// draw memory by address (memviz).
	if ch := l.Apply(vmmMap(1, 0x7000_0000, 2<<20, 0xa1)); ch.Mapped == nil || ch.Mapped.Addr != 0x7000_0000 ||
		ch.Mapped.Size != 2<<20 || ch.Mapped.Alloc == nil || !ch.Mapped.Alloc.Mapped() || ch.Unmapped != nil {
		t.Fatalf("map: %+v", ch)
	}
	l.Apply(vmmMap(1, 0x7020_0000, 2<<20, 0xa2))
	l.Apply(vmmMap(1, 0x7040_0000, 4<<20, 0xa3))
	l.Apply(&events.Event{PID: 1, API: events.CuMemMap, Addr: 0x7080_0000, Size: 1, Aux: 0xa1, Flags: events.FlagAux, Result: 1})

	p := l.Process(1)
	if p.Live != 8<<20 || p.Mapped != 8<<20 || p.Reserved != 1<<30 || p.Maps != 3 || p.FailedMaps != 1 {
		t.Fatalf("after map: live %d mapped %d reserved %d maps %d failed %d", p.Live, p.Mapped, p.Reserved, p.Maps, p.FailedMaps)
	}
	ms := p.Mappings()
	if len(ms) != 3 || ms[2].Addr != 0x7040_0000 || ms[2].Device != 0 || ms[0].Device != 1 || ms[0].Alloc == nil ||
		ms[0].Alloc.Addr != 0xa1 {
		t.Fatalf("mappings %+v", ms)
	}

	// Released right after mapping, as CUDA's samples do: still held.
	if ch := l.Apply(free(1, events.CuMemRelease, 0xa1)); ch.Freed != nil {
		t.Fatalf("release of mapped memory freed %+v", ch.Freed)
	}
	l.Apply(free(1, events.CuMemRelease, 0xa2))
	if p.Live != 8<<20 || p.Frees != 2 || len(p.LiveAllocations()) != 3 || p.LiveCount() != 3 {
		t.Fatalf("after release: live %d frees %d, %d live allocations (LiveCount %d)", p.Live, p.Frees,
			len(p.LiveAllocations()), p.LiveCount())
	}
	// The driver may hand a released handle out again.
	l.Apply(alloc(1, events.CuMemCreate, 0xa1, 6<<20, 1, 0xc))
	if p.Live != 14<<20 || p.Replaced != 0 || len(p.LiveAllocations()) != 4 || p.LiveCount() != 4 {
		t.Fatalf("reused handle: live %d replaced %d, LiveCount %d", p.Live, p.Replaced, p.LiveCount())
	}

	// One cuMemUnmap over the first two mappings frees both.
	ch := l.Apply(sized(1, events.CuMemUnmap, 0x7000_0000, 4<<20))
	if ch.Freed == nil || ch.Freed.Size != 2<<20 || len(ch.AlsoFreed) != 1 || ch.Freed.Addr != 0xa1 || ch.AlsoFreed[0].Addr != 0xa2 {
		t.Fatalf("unmap of two: %+v", ch)
	}
	if len(ch.Unmapped) != 2 || ch.Unmapped[0].Addr != 0x7000_0000 || ch.Unmapped[1].Addr != 0x7020_0000 {
		t.Fatalf("unmap of two: unmapped %+v", ch.Unmapped)
	}
	if p.Live != 10<<20 || p.Mapped != 4<<20 || p.Unmaps != 2 || p.Devices[1].Live != 6<<20 {
		t.Fatalf("after unmap: live %d mapped %d unmaps %d dev1 %d", p.Live, p.Mapped, p.Unmaps, p.Devices[1].Live)
	}
	// Unmapped first, released later: the release frees it.
	if ch := l.Apply(sized(1, events.CuMemUnmap, 0x7040_0000, 4<<20)); ch.Freed != nil || len(ch.Unmapped) != 1 {
		t.Fatalf("unmap of unreleased memory: %+v", ch)
	}
	if a := p.LiveAllocations(); len(a) != 2 || a[0].Mapped() || a[1].Mapped() {
		t.Fatalf("after the unmaps, live VMM memory is mapped nowhere: %+v", a)
	}
	if ch := l.Apply(free(1, events.CuMemRelease, 0xa3)); ch.Freed == nil || ch.Freed.Size != 4<<20 {
		t.Fatalf("release after unmap: %+v", ch)
	}
	l.Apply(sized(1, events.CuMemUnmap, 0x9000_0000, 1<<20)) // never mapped
	l.Apply(sized(1, events.CuMemAddressFree, 0x7000_0000, 1<<30))
	if p.Live != 6<<20 || p.Mapped != 0 || p.MappedPeak != 8<<20 || p.Reserved != 0 || p.UnknownUnmaps != 1 ||
		len(p.Mappings()) != 0 || l.StackOf(1, []uint64{0xa}, false).Live != 0 || l.StackOf(1, []uint64{0xc}, false).Live != 6<<20 {
		t.Fatalf("end: live %d mapped %d/%d reserved %d unknown unmaps %d", p.Live, p.Mapped, p.MappedPeak, p.Reserved, p.UnknownUnmaps)
	}
}

func ctxEv(pid uint32, api events.API, handle uint64, dev int32, after uint64) *events.Event {
	return &events.Event{PID: pid, TID: pid, Comm: "w", API: api, Addr: handle, Device: dev, Size: after,
		Flags: events.FlagEntryOnly}
}

// TestImplicitFrees: a context that dies frees what was allocated in it,
// and only that; a device's primary context frees the runtime's
// allocations on it (no context call seen) and its own; VMM memory stays.
// The address comes back afterwards without a lost free (no "replaced").
func TestImplicitFrees(t *testing.T) {
	const prim0, created = 0xc7c0000, 0xc7c1000
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 100, 0))            // runtime, device 0: primary 0's
	l.Apply(ctxEv(1, events.CuDevicePrimaryCtxRetain, prim0, 0, 0)) // retained, not current
	l.Apply(ctxEv(1, events.CuCtxCreate, created, 0, created))      // pushed
	l.Apply(alloc(1, events.CuMemAlloc, 0x2000, 200, 0))            // in created
	l.Apply(alloc(1, events.CuMemHostAlloc, 0x9000, 70, 0))         // pinned, in created
	l.Apply(alloc(1, events.CuMemCreate, 0x77, 300, 0))             // VMM: the process's
	l.Apply(ctxEv(1, events.CuCtxSetCurrent, prim0, 0, prim0))      // top replaced
	l.Apply(alloc(1, events.CuMemAlloc, 0x3000, 400, 0))            // in primary 0
	l.Apply(ctxEv(1, events.CuCtxPushCurrent, created, 0, created)) // created on top again
	ch := l.Apply(ctxEv(1, events.CuCtxDestroy, created, 0, prim0)) // dies, popped
	if !ch.Implicit || ch.Freed == nil || ch.Freed.Addr != 0x2000 || len(ch.AlsoFreed) != 1 || ch.AlsoFreed[0].Addr != 0x9000 {
		t.Fatalf("destroy: change %+v", ch)
	}
	p := l.Process(1)
	if p.ImplicitFrees != 2 || p.ImplicitFreeBytes != 270 || p.Frees != 0 || p.Live != 800 || p.HostLive != 0 {
		t.Fatalf("after destroy: implicit %d/%d frees %d live %d host %d", p.ImplicitFrees, p.ImplicitFreeBytes,
			p.Frees, p.Live, p.HostLive)
	}
	l.Apply(alloc(1, events.CuMemAlloc, 0x2000, 10, 0)) // reused, in primary 0 now
	if p.Replaced != 0 {
		t.Errorf("replaced %d after an implicit free, want 0", p.Replaced)
	}
	ch = l.Apply(ctxEv(1, events.CuDevicePrimaryCtxReset, prim0, 0, prim0))
	if !ch.Implicit || len(ch.AlsoFreed) != 2 {
		t.Fatalf("reset: change %+v", ch)
	}
	d := p.Devices[0]
	if p.Live != 300 || p.ImplicitFrees != 5 || p.ImplicitFreeBytes != 780 || d.ImplicitFrees != 4 ||
		d.ImplicitFreeBytes != 710 || d.Live != 300 || p.LiveCount() != 1 {
		t.Errorf("after reset: live %d implicit %d/%d device %+v live allocations %d", p.Live, p.ImplicitFrees,
			p.ImplicitFreeBytes, *d, p.LiveCount())
	}
}

func TestExit(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CudaMalloc, 0x1000, 100, 0, 0xa))
	l.Apply(alloc(1, events.CudaMalloc, 0x2000, 40, 1, 0xa))
	l.Apply(alloc(1, events.CudaMalloc, 0x3000, 7, 1, 0xb))
	l.Apply(alloc(1, events.CudaMallocHost, 0x9000, 70, 0, 0xb))
	l.Apply(alloc(1, events.TorchMalloc, 0x1000, 60, 0, 0xc))
	l.Apply(free(1, events.CudaFree, 0x3000))
	l.Apply(alloc(2, events.CudaMalloc, 0x1000, 5, 0, 0xd)) // another process: untouched

	ch := l.Apply(&events.Event{PID: 1, TID: 1, API: events.ProcessExit, Time: 99, Flags: events.FlagEntryOnly})
	if !ch.Exit || ch.Implicit || ch.Process == nil {
		t.Fatalf("change %+v", ch)
	}
	var freed []uint64
	for a := range ch.AllFreed() {
		freed = append(freed, a.Size)
	}
	if want := []uint64{100, 40, 70, 60}; !slices.Equal(freed, want) { // segments by address, then tensors
		t.Errorf("freed %v, want %v", freed, want)
	}
	p := l.Process(1)
	for name, c := range map[string][2]uint64{
		"live": {p.Live, 0}, "host_live": {p.HostLive, 0}, "tensor_live": {p.TensorLive, 0},
		"held_at_exit_allocs": {p.HeldAtExitAllocs, 2}, "held_at_exit_bytes": {p.HeldAtExitBytes, 140},
		"host_held_at_exit": {p.HostHeldAtExit, 70}, "tensor_held_at_exit": {p.TensorHeldAtExit, 60},
		"frees": {p.Frees, 1}, "implicit_frees": {p.ImplicitFrees, 0}, "peak": {p.Peak, 147}, "exit_time": {p.ExitTime, 99},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %d, want %d", name, c[0], c[1])
		}
	}
	devs := p.DeviceList()
	if len(devs) != 2 || devs[0].Live != 0 || devs[0].HeldAtExitAllocs != 1 || devs[0].HeldAtExitBytes != 100 ||
		devs[0].TensorHeldAtExit != 60 || devs[1].Live != 0 || devs[1].HeldAtExitAllocs != 1 || devs[1].HeldAtExitBytes != 40 {
		t.Errorf("devices %+v %+v", *devs[0], *devs[1])
	}
	if p.LiveCount() != 0 || len(p.LiveTensors()) != 0 {
		t.Errorf("still live: %d segments, %d tensors", p.LiveCount(), len(p.LiveTensors()))
	}
	segs, tensors := p.AtEnd()
	if len(segs) != 3 || segs[0].Addr != 0x1000 || segs[2].Addr != 0x9000 || len(tensors) != 1 || tensors[0].Size != 60 {
		t.Errorf("at end: %d segments, %d tensors", len(segs), len(tensors))
	}
	st := l.StackOf(1, []uint64{0xa}, false)
	if st.Live != 0 || st.LiveCount != 0 || st.HeldAtExit != 140 || st.HeldAtExitCount != 2 {
		t.Errorf("stack 0xa %+v", *st)
	}
	if q := l.Process(2); q.Live != 5 || q.Exited {
		t.Errorf("process 2 live %d exited %v", q.Live, q.Exited)
	}
	// A second exit record (two threads ending at once) changes nothing.
	ch = l.Apply(&events.Event{PID: 1, TID: 2, API: events.ProcessExit, Time: 120, Flags: events.FlagEntryOnly})
	if ch.Freed != nil || p.HeldAtExitBytes != 140 || p.ExitTime != 99 {
		t.Errorf("second exit: freed %v, held %d, time %d", ch.Freed, p.HeldAtExitBytes, p.ExitTime)
	}
	// The exit of a process never seen makes no account.
	if ch := l.Apply(&events.Event{PID: 7, API: events.ProcessExit}); ch.Process != nil || l.Process(7) != nil {
		t.Error("exit of an unseen process made an account")
	}
}

// Allocations made while a thread's context was unknown (it was made
// current before tracing began) go with that context once the thread says
// which it is, and only those of that thread.
func TestUnknownContextLearned(t *testing.T) {
	l := New()
	const ctx = 0xc0
	unknown := func(tid uint32, addr, size uint64) *events.Event {
		ev := alloc(1, events.CuMemAlloc, addr, size, events.DeviceUnknown, 0xa)
		ev.TID = tid
		return ev
	}
	l.Apply(unknown(1, 0x1000, 100))
	l.Apply(unknown(1, 0x2000, 20))
	l.Apply(unknown(2, 0x3000, 7)) // another thread: its context is not known
	learn := &events.Event{PID: 1, TID: 1, API: events.CuCtxGetCurrent, Addr: ctx, Size: ctx, Device: events.DeviceUnknown, Flags: events.FlagEntryOnly}
	l.Apply(learn)
	l.Apply(unknown(1, 0x4000, 3)) // after: in ctx, as the thread's current context
	ch := l.Apply(&events.Event{PID: 1, TID: 1, API: events.CuCtxDestroy, Addr: ctx, Device: events.DeviceUnknown, Flags: events.FlagEntryOnly})
	var freed []uint64
	for a := range ch.AllFreed() {
		freed = append(freed, a.Addr)
	}
	if want := []uint64{0x1000, 0x2000, 0x4000}; !slices.Equal(freed, want) {
		t.Errorf("freed with the context: %#x, want %#x", freed, want)
	}
	p := l.Process(1)
	if p.ImplicitFrees != 3 || p.ImplicitFreeBytes != 123 || p.Live != 7 {
		t.Errorf("implicit frees %d (%d bytes), live %d; want 3 (123), 7", p.ImplicitFrees, p.ImplicitFreeBytes, p.Live)
	}
	if d := p.Devices[events.DeviceUnknown]; d == nil || d.ImplicitFrees != 3 || d.Live != 7 {
		t.Errorf("unknown device %+v", d)
	}
}

// A context made current before tracing began, which the thread only pops
// (its pop's return names it) and detaches: what the thread allocated in
// it, on the device unknown and on the device it learned since, dies with
// it; not what it allocated after the pop, nor after a cuCtxSetCurrent
// replaced an unnamed context (that one can no longer be named).
func TestUnknownContextPopped(t *testing.T) {
	l := New()
	const ctx, below, other = 0xc0, 0xd0, 0xe0
	on := func(tid uint32, addr, size uint64, dev int32) *events.Event {
		ev := alloc(1, events.CuMemAlloc, addr, size, dev, 0xa)
		ev.TID = tid
		return ev
	}
	rec := func(tid uint32, api events.API, addr, size uint64, dev int32) *events.Event {
		return &events.Event{PID: 1, TID: tid, API: api, Addr: addr, Size: size, Device: dev, Flags: events.FlagEntryOnly}
	}
	l.Apply(on(1, 0x1000, 100, events.DeviceUnknown))
	l.Apply(rec(1, events.CuCtxGetDevice, 0, 0, 1)) // its device, not its context
	l.Apply(on(1, 0x2000, 20, 1))
	if p := l.Process(1); !p.Untold(1) || p.Untold(2) {
		t.Fatal("thread 1 has untold allocations and thread 2 none")
	}
	// Thread 2, also from before tracing: cuCtxSetCurrent replaces its
	// unnamed context, then it pops back below it.
	l.Apply(on(2, 0x5000, 5, events.DeviceUnknown))
	l.Apply(rec(2, events.CuCtxSetCurrent, other, other, 0))
	l.Apply(rec(2, events.CuCtxSetCurrent, 0, 0, events.DeviceUnknown))
	l.Apply(rec(2, events.CuCtxPopCurrent, below, 0, events.DeviceUnknown))
	l.Apply(rec(1, events.CuCtxPopCurrent, ctx, 0, events.DeviceUnknown)) // the pop's return: ctx popped
	l.Apply(on(1, 0x3000, 3, events.DeviceUnknown))                       // in the one below: unknown
	ch := l.Apply(rec(1, events.CuCtxDetach, ctx, 0, events.DeviceUnknown))
	var freed []uint64
	for a := range ch.AllFreed() {
		freed = append(freed, a.Addr)
	}
	if want := []uint64{0x1000, 0x2000}; !slices.Equal(freed, want) {
		t.Errorf("freed with the context: %#x, want %#x", freed, want)
	}
	p := l.Process(1)
	if p.ImplicitFrees != 2 || p.ImplicitFreeBytes != 120 || p.Live != 8 {
		t.Errorf("implicit frees %d (%d bytes), live %d; want 2 (120), 8", p.ImplicitFrees, p.ImplicitFreeBytes, p.Live)
	}
	if d := p.Devices[1]; d == nil || d.ImplicitFrees != 1 || d.ImplicitFreeBytes != 20 {
		t.Errorf("device 1 %+v", d)
	}
	if d := p.Devices[events.DeviceUnknown]; d == nil || d.ImplicitFrees != 1 || d.Live != 8 {
		t.Errorf("unknown device %+v", d)
	}
	// Thread 2's 5 bytes were made in the context cuCtxSetCurrent
	// replaced, not in the one it popped later.
	if ch := l.Apply(rec(2, events.CuCtxDestroy, below, 0, events.DeviceUnknown)); ch.Freed != nil {
		t.Errorf("destroying the context below freed %#x", ch.Freed.Addr)
	}
	if !p.Untold(1) || p.Untold(2) {
		t.Error("thread 1's 3 bytes after the pop are untold, thread 2's were lost")
	}
}

// VMM memory is held at exit like the rest; the mappings and reserved
// ranges, which hold no memory, stay as they were at the end.
func TestExitVMM(t *testing.T) {
	l := New()
	l.Apply(alloc(1, events.CuMemCreate, 0x77, 4096, 1, 0xa))
	l.Apply(sized(1, events.CuMemAddressReserve, 0x10000, 1<<20))
	l.Apply(vmmMap(1, 0x10000, 4096, 0x77))
	l.Apply(free(1, events.CuMemRelease, 0x77)) // released while mapped: live until unmapped
	l.Apply(&events.Event{PID: 1, TID: 1, API: events.ProcessExit, Flags: events.FlagEntryOnly})
	p := l.Process(1)
	if p.Live != 0 || p.HeldAtExitAllocs != 1 || p.HeldAtExitBytes != 4096 || p.LiveCount() != 0 {
		t.Errorf("live %d, held at exit %d (%d bytes), live count %d", p.Live, p.HeldAtExitAllocs, p.HeldAtExitBytes, p.LiveCount())
	}
	if p.Mapped != 4096 || p.Reserved != 1<<20 || len(p.Mappings()) != 1 {
		t.Errorf("mapped %d, reserved %d, %d mappings: want them as at the end", p.Mapped, p.Reserved, len(p.Mappings()))
	}
	if segs, _ := p.AtEnd(); len(segs) != 1 || segs[0].Addr != 0x77 || !segs[0].Released() {
		t.Errorf("at end: %+v", segs)
	}
}

// TestLookupsRemembered checks the process, device and stack the ledger
// remembers from one event to the next (last, lastDev, lastStack) against
// its maps' answers, over events that switch process, device, stack and
// tensor layer at random, with processes forgotten in between: every
// allocation's change must name the stack StackOf finds for its frames,
// and a process forgotten must start a new account, stacks and all.
func TestLookupsRemembered(t *testing.T) {
	l := New()
	rng := rand.New(rand.NewPCG(1, 2))
	stacks := [][]uint64{{0xa}, {0xa, 0xb}, {0xb, 0xa}, {0xa, 0xb, 0xc}, {}, {0xa, 0xb, 0xd}}
	forgotten := map[*Stack]bool{}
	var addr uint64
	for i := range 20000 {
		pid := uint32(1 + rng.IntN(3))
		switch r := rng.IntN(100); {
		case r < 2:
			for _, st := range l.Stacks() {
				if st.PID == pid {
					forgotten[st] = true
				}
			}
			l.Forget(pid)
			continue
		case r < 45:
			addr++
			api := events.CudaMalloc
			tensor := rng.IntN(4) == 0
			if tensor {
				api = events.TorchMalloc
			}
			frames := slices.Clone(stacks[rng.IntN(len(stacks))])
			ev := alloc(pid, api, addr<<12, 1+uint64(rng.IntN(100)), int32(rng.IntN(3)), frames...)
			ch := l.Apply(ev)
			want := l.StackOf(pid, frames, tensor)
			if ch.Stack == nil || ch.Stack != want || forgotten[ch.Stack] || ch.Process != l.Process(pid) {
				t.Fatalf("event %d: pid %d frames %x tensor %v: change's stack %p (%+v), the map's %p (%+v)",
					i, pid, frames, tensor, ch.Stack, ch.Stack, want, want)
			}
			if d := ch.Process.Devices[ev.Device]; d == nil || (!tensor && d.Live == 0) {
				t.Fatalf("event %d: device %d of pid %d not counted: %+v", i, ev.Device, pid, d)
			}
		default:
			api := events.CudaFree
			if rng.IntN(4) == 0 {
				api = events.TorchFree
			}
			l.Apply(free(pid, api, uint64(1+rng.IntN(int(addr)+1))<<12))
		}
	}
	// Every figure as a ledger that remembers nothing from one event to
	// the next would have it: a process's totals are the sums of its
	// devices', and its stacks' live bytes its live sets'.
	for _, p := range l.Processes() {
		var live, tensorLive uint64
		for _, d := range p.Devices {
			live += d.Live
			tensorLive += d.TensorLive
		}
		if live != p.Live || tensorLive != p.TensorLive {
			t.Errorf("pid %d: devices hold %d and %d tensor bytes, the process %d and %d", p.PID, live, tensorLive, p.Live, p.TensorLive)
		}
		var stackLive uint64
		for _, st := range l.Stacks() {
			if st.PID == p.PID {
				stackLive += st.Live
			}
		}
		var allocs uint64
		for _, a := range slices.Concat(p.LiveAllocations(), p.LiveTensors()) {
			allocs += a.Size
		}
		if stackLive != allocs {
			t.Errorf("pid %d: stacks hold %d live bytes, the live sets %d", p.PID, stackLive, allocs)
		}
	}
}

// TestUntoldCounted follows threads that ran before tracing began through
// random allocations, frees, context records and context ends, several
// threads of a process interleaved: after every event, a thread is Untold
// exactly when one of its live allocations is (the count each thread
// keeps, and the last thread's state the ledger remembers, agree with the
// allocations themselves).
func TestUntoldCounted(t *testing.T) {
	l := New()
	rng := rand.New(rand.NewPCG(3, 4))
	ctxs := []events.API{events.CuCtxGetCurrent, events.CuCtxSetCurrent, events.CuCtxPopCurrent, events.CuCtxPushCurrent}
	untold := 0
	for i := range 50000 {
		pid := uint32(1 + rng.IntN(2))
		tid := pid + uint32(100*rng.IntN(3))
		dev := int32(rng.IntN(2))
		if rng.IntN(2) == 0 {
			dev = events.DeviceUnknown
		}
		addr := uint64(1+rng.IntN(32)) << 12
		var ev *events.Event
		switch r := rng.IntN(100); {
		case r < 5:
			ev = &events.Event{PID: pid, TID: tid, API: ctxs[rng.IntN(len(ctxs))], Addr: uint64(rng.IntN(3)) * 0x100,
				Size: uint64(rng.IntN(3)) * 0x100, Device: dev}
		case r < 7:
			ev = &events.Event{PID: pid, TID: tid, API: events.CuCtxDestroy, Addr: uint64(rng.IntN(3)) * 0x100, Device: dev,
				Flags: events.FlagEntryOnly}
		case r < 55:
			ev = alloc(pid, events.CuMemAlloc, addr, 1, dev, 0xa)
			ev.TID = tid
		default:
			ev = free(pid, events.CuMemFree, addr)
			ev.TID = tid
		}
		l.Apply(ev)
		p := l.Process(pid)
		for _, tt := range []uint32{pid, pid + 100, pid + 200} {
			want := slices.ContainsFunc(p.LiveAllocations(), func(a *Allocation) bool { return a.TID == tt && a.Untold() })
			if p.Untold(tt) != want {
				t.Fatalf("event %d (%+v): thread %d untold %v, its live allocations say %v", i, *ev, tt, p.Untold(tt), want)
			}
			if want {
				untold++
			}
		}
	}
	if untold == 0 {
		t.Fatal("no thread was ever untold: the test tests nothing")
	}
}
