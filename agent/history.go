package agent

import (
	"unsafe"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/ledger"
)

// The flight recorder: every process's latest events, always on, so that
// /snapshot and each OOM black box show what led up to now, as PyTorch's
// _record_memory_history does in-process, for every CUDA process on the
// node, without code changes, and kept after the process dies (SIGKILL
// included) for as long as its account (--retention).
//
// Each process has a ring of at most Options.HistoryEvents items, grown
// as it fills; all rings together hold at most what
// Options.HistoryBudget pays for (historyItemCost a slot). A ring that
// cannot grow within the budget and has less than its fair share takes
// slots from the largest ring above its share (grow), else overwrites its
// oldest: a process that allocates a lot does not starve the history of
// the others.

// Defaults of the flight recorder.
const (
	DefaultHistoryEvents = 100000
	DefaultHistoryBudget = 128 << 20
	historyFirstSlots    = 256
)

// historyItemCost is the bytes a slot accounts for: the item, and the
// allocation it may keep alive after the ledger dropped it (the ledger
// keeps live allocations and stacks anyway).
const historyItemCost = int(unsafe.Sizeof(export.HistoryItem{}) + unsafe.Sizeof(ledger.Allocation{}))

// history is one process's ring, oldest at head.
type history struct {
	items  []export.HistoryItem // len is the capacity
	head   int
	n      int
	denied uint64 // the recorder's gen when it could not grow (0: never)
}

// recorder is the node's flight recorder: the budget the rings share.
type recorder struct {
	perProc int // slots one ring may have
	max     int // slots all rings may have
	used    int // slots all rings have
	rings   map[uint32]*history
	// gen counts the changes of the rings' sizes: a ring denied growth
	// asks again only after one (the budget is full at steady state, and
	// looking for the largest ring at every event would cost).
	gen uint64
}

func newRecorder(events int, budget int64) *recorder {
	r := &recorder{perProc: max(events, 0), rings: map[uint32]*history{}, gen: 1}
	r.max = int(max(budget, 0) / int64(historyItemCost))
	r.perProc = min(r.perProc, r.max)
	return r
}

// add appends it to pid's ring.
func (r *recorder) add(pid uint32, it export.HistoryItem) {
	if r.perProc == 0 {
		return
	}
	h := r.rings[pid]
	if h == nil {
		h = &history{}
		r.rings[pid] = h
	}
	if h.n == len(h.items) && h.denied != r.gen {
		r.grow(pid, h)
	}
	if len(h.items) == 0 {
		return // nothing left in the budget for it
	}
	if h.n < len(h.items) {
		h.items[(h.head+h.n)%len(h.items)] = it
		h.n++
		return
	}
	h.items[h.head] = it // full: the oldest goes
	h.head = (h.head + 1) % len(h.items)
}

// grow gives a full ring more slots when its limit and the budget allow.
// Past the budget, a ring below its fair share (the budget over the
// rings) takes slots from the largest ring above it, which keeps its
// newest items and never goes below the fair share itself: the rings
// settle at their shares instead of taking slots back and forth.
func (r *recorder) grow(pid uint32, h *history) {
	want := min(max(2*len(h.items), historyFirstSlots), r.perProc)
	if want <= len(h.items) {
		return
	}
	if free := r.max - r.used; want-len(h.items) > free {
		fair := r.max / len(r.rings)
		if len(h.items) < fair {
			var big *history
			for p, o := range r.rings {
				if p != pid && (big == nil || len(o.items) > len(big.items)) {
					big = o
				}
			}
			if big != nil && len(big.items) > fair {
				need := min(want, fair) - len(h.items) - free
				// At least a quarter at a time: each shrink copies the ring.
				r.resize(big, max(fair, min(len(big.items)-need, len(big.items)*3/4)))
			}
		}
		want = min(want, len(h.items)+r.max-r.used)
		if want <= len(h.items) {
			h.denied = r.gen
			return
		}
	}
	r.resize(h, want)
}

// resize gives h c slots, keeping its newest items.
func (r *recorder) resize(h *history, c int) {
	items := make([]export.HistoryItem, c)
	keep := min(h.n, c)
	if keep > 0 { // the newest keep items, in at most two runs of the ring
		from := (h.head + h.n - keep) % len(h.items)
		n := copy(items[:keep], h.items[from:])
		copy(items[n:keep], h.items)
	}
	r.used += c - len(h.items)
	r.gen++
	h.items, h.head, h.n = items, 0, keep
}

// list copies pid's ring, oldest first; nil without one.
func (r *recorder) list(pid uint32) []export.HistoryItem {
	h := r.rings[pid]
	if h == nil || h.n == 0 {
		return nil
	}
	out := make([]export.HistoryItem, h.n)
	n := copy(out, h.items[h.head:])
	copy(out[n:], h.items)
	return out
}

// forget drops pid's ring and gives its slots back.
func (r *recorder) forget(pid uint32) {
	if h := r.rings[pid]; h != nil {
		r.used -= len(h.items)
		r.gen++
		delete(r.rings, pid)
	}
}

// events is how many events the rings hold.
func (r *recorder) events() int {
	n := 0
	for _, h := range r.rings {
		n += h.n
	}
	return n
}

// bytes is what the rings account for now.
func (r *recorder) bytes() int64 { return int64(r.used) * int64(historyItemCost) }

// historyItem is what the recorder keeps of one event the ledger applied:
// an allocation, a free (implicit ones included), a failed allocation or
// a VMM map or unmap (where memory_viz draws VMM memory); false for the
// others (context calls that freed nothing, and the process's end: what it
// held then is its snapshot's live set, as a trace export shows it, not
// freed).
func historyItem(ev *events.Event, ch ledger.Change) (export.HistoryItem, bool) {
	if ch.Exit || ch.Alloc == nil && ch.Freed == nil && ch.Stack == nil && ch.Mapped == nil && ch.Unmapped == nil {
		return export.HistoryItem{}, false
	}
	ch.Process = nil
	return export.HistoryItem{End: ev.End(), API: ev.API, Result: ev.Result, Size: ev.Size, Device: ev.Device,
		Change: ch}, true
}
