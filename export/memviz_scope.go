package export

import (
	"cmp"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/pickle"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

// memvizBlockKey names a tensor block: its device, address and size.
type memvizBlockKey struct {
	dev        int
	addr, size uint64
}

// memvizScope follows a replay for the memviz trace lists: the segments
// seen so far, by device, so that a tensor entry is made only for a block
// inside one of them; the latest NVML sample, for device_free; and the
// wall clock, for time_us.
//
// A trace that starts after the process's segments exist (record --pid,
// the agent's /trace windows) sees tensors in segments it never saw
// allocated. Those still live at the moment shown get a segment of their
// own in the snapshot (orphanSegments); the entries of the others are left
// out, as the snapshot lists no memory they could be in.
type memvizScope struct {
	segs map[int][]span // live segments (and VMM mappings) per device, by address
	// orphan says whether a block outside every segment gets entries.
	orphan func(memvizBlockKey) bool
	wall   func(boot uint64) time.Time // a trace's clock (Meta.WallTime); nil: time_us is left out
	last   *tracefile.NVML             // the latest sample of the driver's view
}

type span struct{ start, end uint64 }

func newMemvizScope(orphan func(memvizBlockKey) bool) *memvizScope {
	return &memvizScope{segs: map[int][]span{}, orphan: orphan}
}

// add notes a segment, or a VMM mapping, of size bytes at addr on dev.
func (s *memvizScope) add(dev int, addr, size uint64) {
	sp := span{addr, addr + size}
	i, _ := slices.BinarySearchFunc(s.segs[dev], sp.start, func(x span, addr uint64) int { return cmp.Compare(x.start, addr) })
	s.segs[dev] = slices.Insert(s.segs[dev], i, sp)
}

// remove forgets the segment or mapping at addr on dev.
func (s *memvizScope) remove(dev int, addr uint64) {
	i, ok := slices.BinarySearchFunc(s.segs[dev], addr, func(x span, addr uint64) int { return cmp.Compare(x.start, addr) })
	if ok {
		s.segs[dev] = slices.Delete(s.segs[dev], i, i+1)
	}
}

// within reports whether [addr, end) on dev lies in the segments noted,
// over adjacent ones too: a tensor of an expandable segment spans the
// mappings that PyTorch made one after the other.
func (s *memvizScope) within(dev int, addr, end uint64) bool {
	segs := s.segs[dev]
	i, _ := slices.BinarySearchFunc(segs, addr+1, func(x span, addr uint64) int { return cmp.Compare(x.start, addr) })
	if i == 0 || addr < segs[i-1].start {
		return false
	}
	for j := i - 1; j < len(segs); j++ {
		if segs[j].end >= end {
			return true
		}
		if j+1 == len(segs) || segs[j+1].start != segs[j].end {
			return false
		}
	}
	return false
}

// covers reports whether tensor block a gets trace entries, and whether it
// is an orphan (in no segment seen).
func (s *memvizScope) covers(a *ledger.Allocation) (ok, orphan bool) {
	if s == nil || s.orphan == nil {
		return true, false
	}
	if s.within(int(a.Device), a.Addr, a.Addr+a.Size) {
		return true, false
	}
	return s.orphan(memvizBlockKey{int(a.Device), a.Addr, a.Size}), true
}

func (s *memvizScope) nvml(n *tracefile.NVML) {
	if n.Error == "" && len(n.Devices) > 0 {
		s.last = n
	}
}

// deviceFree is the driver's free memory on dev at the latest NVML sample
// (NVML's index is taken as the CUDA ordinal; with one GPU they agree);
// false when the trace has no sample of it before: without NVML nothing in
// the trace says how large the device is (no probe reads cuMemGetInfo), so
// no honest figure exists and the entry leaves device_free out.
func (s *memvizScope) deviceFree(dev int) (uint64, bool) {
	if s == nil || s.last == nil {
		return 0, false
	}
	if len(s.last.Devices) == 1 {
		return s.last.Devices[0].Free, true
	}
	for _, d := range s.last.Devices {
		if d.Index == dev {
			return d.Free, true
		}
	}
	return 0, false
}

// timeUS is when ev returned, in Unix µs; 0 without a clock.
func (s *memvizScope) timeUS(ev *events.Event) int64 {
	if s == nil || s.wall == nil {
		return 0
	}
	return s.wall(ev.End()).UnixMicro()
}

// orphanSegments makes a segment of each live tensor that lies in none of
// segs (live by address): memory the process held before the trace began.
// Each is exactly the tensor's size, one active block, so its entries,
// which have this size too, fit it. Tensors overlapping one before (a lost
// free) are left out.
func orphanSegments(segs []MemvizSegment, live []*ledger.Allocation, stack func(*ledger.Stack) []MemvizFrame) []MemvizSegment {
	scope := newMemvizScope(func(memvizBlockKey) bool { return false })
	for i := range segs {
		scope.add(segs[i].Device, segs[i].Address, segs[i].TotalSize)
	}
	var out []MemvizSegment
	lastEnd := map[int32]uint64{}
	for _, t := range live {
		if t.Size == 0 || t.Addr < lastEnd[t.Device] {
			continue
		}
		if ok, _ := scope.covers(t); ok {
			continue
		}
		if i, _ := slices.BinarySearchFunc(scope.segs[int(t.Device)], t.Addr+t.Size, func(x span, addr uint64) int {
			return cmp.Compare(x.start, addr)
		}); i > 0 && scope.segs[int(t.Device)][i-1].end > t.Addr {
			continue // straddles a segment's edge
		}
		lastEnd[t.Device] = t.Addr + t.Size
		out = append(out, memvizSegment(t, stack(t.Stack)))
	}
	return out
}

// MemvizSettings is the snapshot's "allocator_settings": what memory_viz's
// Allocator Settings tab shows. Only the keys cudatrace knows are written.
type MemvizSettings struct {
	// MaxEntries is the cap on each device's trace (trace_alloc_max_entries);
	// 0: none.
	MaxEntries int
	// Overflowed says a device's trace was cut to MaxEntries
	// (trace_alloc_overflowed): older entries are missing.
	Overflowed bool
	// DeviceFree says where the oom entries' device_free comes from, or
	// why some leave it out; "" without oom entries.
	DeviceFree string
}

func (m *MemvizSettings) pyValue() pickle.Dict {
	d := pickle.Dict{
		{Key: "trace_alloc_max_entries", Value: m.MaxEntries},
		{Key: "trace_alloc_overflowed", Value: m.Overflowed},
	}
	if m.DeviceFree != "" {
		d = append(d, pickle.KV{Key: "device_free_source", Value: m.DeviceFree})
	}
	return d
}
