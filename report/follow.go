package report

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
)

// What the report learns by following the ledger event by event, beyond
// its end state: the live set behind each failed call, used and peak bytes
// per interval, and when each process reached its peak.

// maxFailureStacks bounds the failures per process whose live set is
// broken down by stack: the breakdown walks the live set, and a job that
// retries a failing allocation in a loop fails thousands of times alike.
const maxFailureStacks = 20

// failureStacks is how many stacks a failure's live set lists.
const failureStacks = 5

// maxIntervals bounds the rows of --interval per process and device.
const maxIntervals = 100000

type follower struct {
	start    uint64 // boot ns of the recording's start
	interval uint64 // ns; 0: no interval table

	// Per PID, parallel to the ledger's Process.Failures; no stacks past
	// maxFailureStacks.
	failures map[uint32][]FailureContext
	// Per PID: its events so far, and how many it had when its peak was
	// last raised (a second replay stops there to see the peak's stacks).
	seq, peakSeq map[uint32]uint64
	peak         map[uint32]uint64

	spans map[spanKey]*span
}

type spanKey struct {
	pid    uint32
	device int32
}

// span follows one process's use of one device, interval by interval.
type span struct {
	live       uint64
	k          uint64 // the interval under way
	startLive  uint64 // live when it began
	peak       uint64 // highest live in it
	rows       []Interval
	overflowed bool
}

func newFollower(start, interval uint64) *follower {
	return &follower{start: start, interval: interval, failures: map[uint32][]FailureContext{},
		seq: map[uint32]uint64{}, peakSeq: map[uint32]uint64{}, peak: map[uint32]uint64{}, spans: map[spanKey]*span{}}
}

func (f *follower) onEvent(ev *events.Event, ch ledger.Change) error {
	p := ch.Process
	if p == nil {
		return nil
	}
	f.seq[p.PID]++
	if p.Peak > f.peak[p.PID] {
		f.peak[p.PID] = p.Peak
		f.peakSeq[p.PID] = f.seq[p.PID]
	}
	if ch.Stack != nil && ch.Alloc == nil && len(p.Failures) > len(f.failures[p.PID]) {
		n := 0
		if len(f.failures[p.PID]) < maxFailureStacks {
			n = failureStacks
		}
		f.failures[p.PID] = append(f.failures[p.PID], ContextOf(p, ev.Device, n))
	}
	// A process's end is no step: its intervals are of what it held until
	// it ended (held at exit, as the other views at the end).
	if f.interval == 0 || ch.Exit {
		return nil
	}
	t := ev.End()
	for a := range ch.AllFreed() {
		if a.API.Segment() {
			f.span(p.PID, a.Device, t).add(-int64(a.Size))
		}
	}
	if a := ch.Alloc; a != nil && a.API.Segment() {
		f.span(p.PID, a.Device, t).add(int64(a.Size))
	}
	return nil
}

// span returns the span of pid on device, moved on to the interval holding
// t. Events from different CPUs reach the trace nearly, not strictly, in
// time order: one a little older than the interval under way counts in it.
func (f *follower) span(pid uint32, device int32, t uint64) *span {
	key := spanKey{pid, device}
	s := f.spans[key]
	k := f.index(t)
	if s == nil {
		s = &span{k: k}
		f.spans[key] = s
	}
	s.advance(f, key, k)
	return s
}

func (f *follower) index(t uint64) uint64 {
	if t <= f.start {
		return 0
	}
	return (t - f.start) / f.interval
}

func (s *span) add(delta int64) {
	s.live = uint64(int64(s.live) + delta)
	s.peak = max(s.peak, s.live)
}

// advance closes the intervals before k, idle ones included: an epoch in
// which nothing was allocated is still a row.
func (s *span) advance(f *follower, key spanKey, k uint64) {
	for s.k < k {
		s.close(f, key)
		s.k++
		s.startLive, s.peak = s.live, s.live
	}
}

func (s *span) close(f *follower, key spanKey) {
	if len(s.rows) >= maxIntervals {
		s.overflowed = true
		return
	}
	start := s.k * f.interval
	s.rows = append(s.rows, Interval{PID: key.pid, Device: key.device, StartNS: start, EndNS: start + f.interval,
		LiveStart: s.startLive, LiveEnd: s.live, Peak: s.peak, Used: int64(s.live) - int64(s.startLive),
		Peaked: s.peak - max(s.startLive, s.live)})
}

// intervals closes every span at the end of the trace and returns the rows
// by process, device and time.
func (f *follower) intervals(last uint64) ([]Interval, bool) {
	out := []Interval{}
	overflowed := false
	end := f.index(last)
	for key, s := range f.spans {
		s.advance(f, key, end)
		s.close(f, key)
		out = append(out, s.rows...)
		overflowed = overflowed || s.overflowed
	}
	slices.SortFunc(out, func(a, b Interval) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Device, b.Device), cmp.Compare(a.StartNS, b.StartNS))
	})
	return out, overflowed
}

// peakStacks replays the trace a second time, stopping in each process at
// the event that raised its peak last, and returns the stacks of its live
// GPU memory then, each as the first pass's aggregate (so it is symbolized
// once, with the first pass's mappings).
//
// With the stacks, it returns each process's live GPU allocations then
// (their stacks, too, the first pass's), for the owners at the peak.
func (f *follower) peakStacks(t *replay.Trace) (map[uint32][]LiveShare, map[uint32][]liveAt, error) {
	want := map[uint32]uint64{}
	for pid, n := range f.peakSeq {
		if f.peak[pid] > 0 {
			want[pid] = n
		}
	}
	out := map[uint32][]LiveShare{}
	live := map[uint32][]liveAt{}
	if len(want) == 0 {
		return out, live, nil
	}
	seq := map[uint32]uint64{}
	_, err := replay.Read(t.Path, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		p := ch.Process
		if p == nil {
			return nil
		}
		seq[p.PID]++
		if seq[p.PID] != want[p.PID] {
			return nil
		}
		stacks := LiveByStack(p, func(*ledger.Allocation) bool { return true })
		for i := range stacks {
			stacks[i].Stack = t.Ledger.StackOf(p.PID, stacks[i].Stack.Frames, stacks[i].Stack.Tensor)
		}
		out[p.PID] = stacks
		first := map[*ledger.Stack]*ledger.Stack{}
		for _, a := range p.LiveAllocations() {
			if !a.API.Segment() {
				continue
			}
			st, ok := first[a.Stack]
			if !ok {
				st = t.Ledger.StackOf(p.PID, a.Stack.Frames, a.Stack.Tensor)
				first[a.Stack] = st
			}
			live[p.PID] = append(live[p.PID], liveAt{Stack: st, Device: a.Device, Size: a.Size})
		}
		return nil
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("replay to the peak: %w", err)
	}
	return out, live, nil
}
