package export

import (
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
)

// HistoryItem is one event of a process's recent history, as the agent's
// flight recorder keeps it: the call, and what the ledger did with it.
// Its Change's allocations and stack are the ledger's, which never change
// the fields read here, so a copy of a history may be read on another
// goroutine.
type HistoryItem struct {
	End    uint64 // when the call returned (boot-time ns)
	API    events.API
	Result int32
	Size   uint64 // bytes asked for (what a failed allocation asked)
	Device int32
	Change ledger.Change // its Process is left nil
	// DeviceFree, for a failed allocation: the driver's free memory on its
	// device then (NVML's latest sample); nil where it is unknown.
	DeviceFree *uint64
}

// HistoryEntries turns a process's latest events (oldest first) into the
// trace entries of its live snapshot, by the rules a trace's export
// follows (memvizEntries), so that memory_viz, undoing them from the
// snapshot backwards, finds every block where the snapshot (segments,
// mappings, and liveTensors' orphan segments with tensors) or an entry
// after it put one.
//
// The history starts in the middle of the process's life: the segments
// and VMM mappings live at its first item are the live ones now, with the
// history's own frees and unmaps put back and its allocations and maps
// taken out. Tensor entries outside them are left out, as a trace's export
// leaves them out.
func HistoryEntries(history []HistoryItem, segments []*ledger.Allocation, mappings []*ledger.Mapping,
	liveTensors []*ledger.Allocation, tensors bool, wall func(boot uint64) time.Time) []LiveEntry {
	if len(history) == 0 {
		return nil
	}
	var segs []*ledger.Allocation
	for _, a := range segments {
		if a.API.Segment() && a.API != events.CuMemCreate && a.Device != events.DeviceUnknown {
			segs = append(segs, a)
		}
	}
	orphans := map[memvizBlockKey]bool{}
	if tensors {
		l := memvizSegments(segments, mappings, liveTensors, true, func(*ledger.Stack) []MemvizFrame { return nil })
		for _, seg := range l.orphans {
			orphans[memvizBlockKey{seg.Device, seg.Address, seg.TotalSize}] = true
		}
	}
	// The segments and mappings at the history's start, by undoing it
	// from now.
	atStart := map[*ledger.Allocation]bool{}
	for _, a := range segs {
		atStart[a] = true
	}
	mappedAtStart := map[*ledger.Mapping]bool{}
	for _, m := range mappings {
		if m.Device != events.DeviceUnknown {
			mappedAtStart[m] = true
		}
	}
	for i := len(history) - 1; i >= 0; i-- {
		ch := &history[i].Change
		if m := ch.Mapped; m != nil {
			delete(mappedAtStart, m)
		}
		for _, m := range ch.Unmapped {
			if m.Device != events.DeviceUnknown {
				mappedAtStart[m] = true
			}
		}
		if a := ch.Alloc; a != nil && a.API.Segment() && !a.Before {
			delete(atStart, a)
		}
		for a := range ch.AllFreed() {
			if a.API.Segment() && a.API != events.CuMemCreate {
				atStart[a] = true
			}
		}
	}
	scope := newMemvizScope(func(k memvizBlockKey) bool { return orphans[k] })
	scope.wall = wall
	for a := range atStart {
		scope.add(int(a.Device), a.Addr, a.Size)
	}
	for m := range mappedAtStart {
		scope.add(int(m.Device), m.Addr, m.Size)
	}

	var out []LiveEntry
	for i := range history {
		it := &history[i]
		ev := events.Event{Time: it.End, API: it.API, Result: it.Result, Size: it.Size, Device: it.Device}
		memvizEntries(&ev, it.Change, tensors, scope, func(dev int, e MemvizTraceEntry) {
			le := LiveEntry{Action: e.Action, Addr: e.Addr, Size: e.Size, Device: int32(dev), Stack: e.stack,
				TimeUS: e.TimeUS}
			if e.Action == MemvizOOM {
				le.Addr, le.DeviceFree = 0, it.DeviceFree
			}
			out = append(out, le)
		}, nil)
	}
	return out
}
