package report

// views.go: `report --by function` and `--by line`, the views users of
// Chainer's CupyMemoryProfileHook and Pytorch-Memory-Utils' MemTracker
// know. Each row is one function (or source line) with what the stacks
// through it allocated at both levels side by side: tensor bytes used (from
// PyTorch's pool) and segment bytes acquired (from the device), the calls,
// what is live of each at the end, and, with --interval, the bytes added
// and removed in each interval. A stack counts once in every row it passes
// through (inclusive, as pprof's cum): the innermost frames are the CUDA
// libraries' own, and the caller that matters is the user's to pick.

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/pystack"
)

// By is what --by groups the view by.
type By string

// The --by values.
const (
	ByFunction By = "function"
	ByLine     By = "line"
)

// ParseBy checks a --by value.
func ParseBy(s string) (By, error) {
	switch By(s) {
	case "", ByFunction, ByLine:
		return By(s), nil
	}
	return "", fmt.Errorf("--by %q: want function or line", s)
}

// ViewRow is one function's or line's row.
type ViewRow struct {
	PID uint32 `json:"pid"`
	Key string `json:"key"` // the function, or file:line
	// UsedBytes and UsedCount: tensors allocated from the framework's pool
	// (PyTorch's pytorch:malloc) through it; AcquiredBytes and
	// AcquiredCount: segments allocated from the device (cudaMalloc and the
	// rest, pinned host memory left out).
	UsedBytes     uint64 `json:"used_bytes"`
	UsedCount     uint64 `json:"used_count"`
	AcquiredBytes uint64 `json:"acquired_bytes"`
	AcquiredCount uint64 `json:"acquired_count"`
	Occurrences   uint64 `json:"occurrences"` // UsedCount + AcquiredCount: the calls
	// What of it is live at the end.
	UsedLiveBytes     uint64 `json:"used_live_bytes"`
	AcquiredLiveBytes uint64 `json:"acquired_live_bytes"`
	// Intervals, with --interval: bytes added and removed (both levels)
	// in each interval, from the start; only intervals with a change.
	Intervals []ViewInterval `json:"intervals,omitempty"`
}

// ViewInterval is one row's change in one interval.
type ViewInterval struct {
	Index        int    `json:"index"` // the interval's number from 0, starting at the recording's start
	AddedBytes   uint64 `json:"added_bytes"`
	RemovedBytes uint64 `json:"removed_bytes"`
}

// viewFollower gathers, while the trace is replayed, each stack's figures
// (pinned host memory left out, which the ledger's stacks count in) and,
// with an interval, its bytes added and removed per interval.
type viewFollower struct {
	start, interval uint64
	stats           map[*ledger.Stack]*viewStat
	moves           map[viewMove]*[2]uint64 // added, removed
}

// viewStat is one stack's allocations of GPU memory: count, bytes, live.
type viewStat struct{ count, bytes, live uint64 }

func newViewFollower(start uint64, interval uint64) *viewFollower {
	return &viewFollower{start: start, interval: interval, stats: map[*ledger.Stack]*viewStat{},
		moves: map[viewMove]*[2]uint64{}}
}

type viewMove struct {
	stack *ledger.Stack
	k     int
}

func (v *viewFollower) onEvent(ev *events.Event, ch ledger.Change) {
	// A process's end removes nothing here: the view's live bytes are what
	// it held at its end (held at exit).
	if v == nil || ch.Process == nil || ch.Exit {
		return
	}
	k := 0
	if t := ev.End(); v.interval > 0 && t > v.start {
		k = int((t - v.start) / v.interval)
	}
	add := func(a *ledger.Allocation, i int) {
		if a.Stack == nil || a.API.Info().Kind == events.KindHost {
			return
		}
		st := v.stats[a.Stack]
		if st == nil {
			st = &viewStat{}
			v.stats[a.Stack] = st
		}
		if i == 0 {
			st.count++
			st.bytes += a.Size
			st.live += a.Size
		} else {
			st.live -= min(st.live, a.Size)
		}
		if v.interval == 0 {
			return
		}
		m := v.moves[viewMove{a.Stack, k}]
		if m == nil {
			m = new([2]uint64)
			v.moves[viewMove{a.Stack, k}] = m
		}
		m[i] += a.Size
	}
	for a := range ch.AllFreed() {
		add(a, 1)
	}
	if ch.Alloc != nil {
		add(ch.Alloc, 0)
	}
}

// viewKeys are the rows a stack counts in, each once: its Python lines
// (or functions) where it has any, else its native ones.
func viewKeys(frames []Frame, by By) []string {
	python := slices.ContainsFunc(frames, func(f Frame) bool { return f.Module == pystack.Module })
	var keys []string
	for _, f := range frames {
		if python && f.Module != pystack.Module {
			continue
		}
		var key string
		switch {
		case by == ByLine && f.File != "":
			key = fmt.Sprintf("%s:%d", f.File, f.Line)
		case by == ByLine:
			continue // no line to name
		case f.Function != "":
			key = f.Function
		default:
			continue
		}
		if !slices.Contains(keys, key) {
			keys = append(keys, key)
		}
	}
	return keys
}

// buildView makes the rows of the view by, from every stack of the
// selected processes: most bytes used first, then acquired.
func buildView(stacks []*ledger.Stack, by By, selected func(uint32) bool, frames func(*ledger.Stack) []Frame,
	vf *viewFollower) []ViewRow {
	type rowKey struct {
		pid uint32
		key string
	}
	rows := map[rowKey]*ViewRow{}
	moves := map[*ledger.Stack][]ViewInterval{}
	for m, v := range vf.moves {
		moves[m.stack] = append(moves[m.stack], ViewInterval{Index: m.k, AddedBytes: v[0], RemovedBytes: v[1]})
	}
	for _, st := range stacks {
		stat := vf.stats[st]
		if !selected(st.PID) || stat == nil || stat.count == 0 {
			continue
		}
		for _, key := range viewKeys(frames(st), by) {
			r := rows[rowKey{st.PID, key}]
			if r == nil {
				r = &ViewRow{PID: st.PID, Key: key}
				rows[rowKey{st.PID, key}] = r
			}
			if st.Tensor {
				r.UsedBytes += stat.bytes
				r.UsedCount += stat.count
				r.UsedLiveBytes += stat.live
			} else {
				r.AcquiredBytes += stat.bytes
				r.AcquiredCount += stat.count
				r.AcquiredLiveBytes += stat.live
			}
			r.Occurrences = r.UsedCount + r.AcquiredCount
			for _, m := range moves[st] {
				i, found := slices.BinarySearchFunc(r.Intervals, m.Index, func(x ViewInterval, k int) int { return cmp.Compare(x.Index, k) })
				if !found {
					r.Intervals = slices.Insert(r.Intervals, i, ViewInterval{Index: m.Index})
				}
				r.Intervals[i].AddedBytes += m.AddedBytes
				r.Intervals[i].RemovedBytes += m.RemovedBytes
			}
		}
	}
	out := make([]ViewRow, 0, len(rows))
	for _, r := range rows {
		if r.Occurrences > 0 {
			out = append(out, *r)
		}
	}
	slices.SortFunc(out, func(a, b ViewRow) int {
		return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(b.AcquiredBytes, a.AcquiredBytes),
			cmp.Compare(a.PID, b.PID), cmp.Compare(a.Key, b.Key))
	})
	return out
}
