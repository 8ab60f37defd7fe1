package export

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/pickle"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// memvizSmall is the largest block PyTorch's caching allocator keeps in its
// small pool; larger segments are "large".
const memvizSmall = 1 << 20

// WriteMemvizTrace writes the trace at path as a PyTorch memory snapshot:
// the live set at opts.At as segments, and every allocation, free and
// out-of-memory failure up to then in device_traces.
//
// The runtime and driver calls cudatrace sees are what PyTorch calls
// segments (cudaMalloc'd memory). Without tensor-level events, each segment
// holds one block covering it, so every view of memory_viz has something
// to draw; the trace shows segment_alloc then alloc, and free_requested,
// free_completed then segment_free. Pinned host memory is left out: it is
// not device memory.
//
// A snapshot is one process's, as torch.cuda.memory._snapshot() is: a
// trace of several processes needs opts.PIDs to pick one.
//
// Each device's trace keeps its latest opts.MemvizEntries entries
// (DefaultMemvizEntries): PyTorch's own trace is such a ring buffer, and
// memory_viz, a web page, slows to a crawl past a few hundred thousand.
//
// Memory stays bounded by the live set: the trace lists are written as a
// replay of the file produces them, one replay per device.
func WriteMemvizTrace(w io.Writer, path string, opts Options) error {
	end, err := until(path, opts.At, &opts)
	if err != nil {
		return err
	}
	// Pass 1: the live set at the moment, the processes, and how many trace
	// entries each device gets (a pickled list does not need its length,
	// but pickle.LazyList does).
	// Both ways of counting, as whether tensor events come is known only
	// at the end.
	counts, tensorCounts := map[int]int{}, map[int]int{}
	tensors := false
	// Tensor entries outside every segment the trace saw are counted
	// apart, by block: only those of blocks still live at the moment get
	// a segment of their own (orphanSegments), and so their entries.
	orphanCounts := map[memvizBlockKey]int{}
	scope := newMemvizScope(func(memvizBlockKey) bool { return true })
	noScope := newMemvizScope(nil)
	var ooms, unknownFree int // oom entries, and those whose device_free is unknown
	t, err := replaySelected(path, end, noScope, &opts, func(ev *events.Event, ch ledger.Change) error {
		tensors = tensors || ev.API.Info().Layer == events.LayerTensor
		memvizEntries(ev, ch, false, noScope, func(dev int, e MemvizTraceEntry) {
			counts[dev]++
			if e.Action == MemvizOOM {
				ooms++
				if e.NoDeviceFree {
					unknownFree++
				}
			}
		}, nil)
		memvizEntries(ev, ch, true, scope, func(dev int, e MemvizTraceEntry) {
			if e.orphan {
				orphanCounts[memvizBlockKey{dev, e.Addr, e.Size}]++
			} else {
				tensorCounts[dev]++
			}
		}, nil)
		return nil
	})
	if err != nil {
		return err
	}
	if err := opts.checkReplay(t, end); err != nil {
		return err
	}
	var pids []uint32
	for _, p := range t.Ledger.Processes() {
		if opts.selected(p.PID) && p.Allocs+p.Failed > 0 {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) > 1 {
		return fmt.Errorf("a memory snapshot is one process's, and this trace has %d: choose one with --pid (%s)",
			len(pids), joinPIDs(pids))
	}

	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	fr := &memvizFramer{t: t, syms: syms, done: map[*ledger.Stack][]MemvizFrame{}}
	defer fr.close()

	snap := &Snapshot{}
	orphans := map[memvizBlockKey]bool{}
	var unknown unknownDevice
	for _, pid := range pids {
		p := t.Ledger.Process(pid)
		// An ended process: what it held at exit is its live set at the
		// end (the trace has no free for it: memviz walks back from here).
		atEnd, live := p.AtEnd() // by address
		var segs []*ledger.Allocation
		for _, a := range atEnd {
			if !a.API.Segment() || unknown.leftOut(a) {
				continue
			}
			segs = append(segs, a)
			seg := memvizSegment(a, fr.frames(a.Stack))
			if tensors {
				seg = memvizTensorSegment(a, fr.frames(a.Stack), live, fr.frames)
			}
			snap.Segments = append(snap.Segments, seg)
		}
		if tensors {
			for _, seg := range orphanSegments(segs, live, fr.frames) {
				snap.Segments = append(snap.Segments, seg)
				orphans[memvizBlockKey{seg.Device, seg.Address, seg.TotalSize}] = true
			}
		}
	}
	if tensors {
		counts = tensorCounts
		for k := range orphans {
			counts[k.dev] += orphanCounts[k]
		}
	}
	maxDev := -1
	for dev, n := range counts {
		if n > 0 {
			maxDev = max(maxDev, dev)
		}
	}
	for i := range snap.Segments {
		maxDev = max(maxDev, snap.Segments[i].Device)
	}
	slices.SortStableFunc(snap.Segments, func(a, b MemvizSegment) int {
		return cmp.Compare(a.Address, b.Address)
	})
	// One trace list per device 0..max, as PyTorch writes them; Validate
	// checks the segments against them.
	snap.DeviceTraces = make([][]MemvizTraceEntry, maxDev+1)
	if err := snap.Validate(); err != nil {
		return err
	}

	limit := opts.MemvizEntries
	if limit == 0 {
		limit = DefaultMemvizEntries
	}
	settings := &MemvizSettings{MaxEntries: max(limit, 0)}
	switch {
	case unknownFree > 0:
		settings.DeviceFree = fmt.Sprintf("unknown for %d of %d ooms: device_free left out, the trace has no NVML sample of the device before them (the device's size is known only to NVML: record where the driver is loaded, with --nvml)",
			unknownFree, ooms)
	case ooms > 0:
		settings.DeviceFree = "nvml: the driver's free memory on the device at its last sample before the oom (--nvml-interval apart)"
	}
	for dev := 0; dev <= maxDev; dev++ {
		if limit > 0 && counts[dev] > limit {
			settings.Overflowed = true
		}
	}
	traces := pickle.LazyList{Len: maxDev + 1, Item: func(dev int) (any, error) {
		n := counts[dev]
		if limit > 0 && n > limit {
			return fr.deviceTrace(path, end, dev, tensors, orphans, n-limit, limit, &opts), nil
		}
		return fr.deviceTrace(path, end, dev, tensors, orphans, 0, n, &opts), nil
	}}
	segments := pickle.LazyList{Len: len(snap.Segments), Item: func(i int) (any, error) {
		return snap.Segments[i].pyValue(), nil
	}}
	enc := pickle.NewEncoder(w)
	err = enc.Encode(pickle.Dict{{Key: "segments", Value: segments}, {Key: "device_traces", Value: traces},
		{Key: "allocator_settings", Value: settings.pyValue()}})
	if fr.err != nil {
		err = fr.err // the replay's error is the cause; the pickle's is its echo
	}
	if err != nil {
		return fmt.Errorf("memviz: %w", err)
	}
	opts.warnGone(syms)
	unknown.warn(&opts)
	return nil
}

// unknownDevice counts the live memory a snapshot leaves out for want of
// a device: memory_viz draws devices, and a thread that chose its device
// before tracing began allocated on events.DeviceUnknown until it said
// which (its trace entries go to no device's list either).
type unknownDevice struct{ n, bytes uint64 }

func (u *unknownDevice) leftOut(a *ledger.Allocation) bool {
	if a.Device != events.DeviceUnknown {
		return false
	}
	u.n++
	u.bytes += a.Size
	return true
}

func (u *unknownDevice) warn(o *Options) {
	if u.n > 0 && o.Warn != nil {
		o.Warn(fmt.Sprintf("memviz: %d live allocations (%s) on an unknown device left out (threads that chose their device before tracing began; `cudatrace report` counts them)",
			u.n, units.Bytes(u.bytes)))
	}
}

func joinPIDs(pids []uint32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = fmt.Sprint(p)
	}
	return strings.Join(s, ", ")
}

func memvizSegment(a *ledger.Allocation, frames []MemvizFrame) MemvizSegment {
	kind := MemvizLarge
	if a.Size <= memvizSmall {
		kind = MemvizSmall
	}
	return MemvizSegment{Device: int(a.Device), Address: a.Addr, TotalSize: a.Size, AllocatedSize: a.Size,
		ActiveSize: a.Size, RequestedSize: a.Size, SegmentType: kind, Frames: frames,
		Blocks: []MemvizBlock{{Address: a.Addr, Size: a.Size, RequestedSize: a.Size, State: MemvizActiveAllocated,
			Frames: frames}}}
}

// memvizEntries calls emit with the trace entries one event makes, device
// by device, with the frames of stack (nil: none). Without tensor events a
// segment is also its one block (segment_alloc then alloc; free_requested,
// free_completed then segment_free); with them, segments and tensor blocks
// have entries of their own.
//
// scope keeps the segments the trace has seen: a tensor entry is made only
// for a block inside one of them, or one scope.orphan lets through, so no
// entry points into memory the snapshot does not list (memory_viz's
// Allocator State History fails on such an entry).
func memvizEntries(ev *events.Event, ch ledger.Change, tensors bool, scope *memvizScope,
	emit func(dev int, e MemvizTraceEntry), stack func(*ledger.Stack) []MemvizFrame) {
	if ch.Exit {
		// What the process held when it ended stays in the snapshot, as
		// live at the end: no free entries for it.
		return
	}
	frames := func(st *ledger.Stack) []MemvizFrame {
		if stack == nil {
			return nil
		}
		return stack(st)
	}
	orphan := false
	entries := func(a *ledger.Allocation, actions ...MemvizAction) {
		f := frames(a.Stack)
		for _, action := range actions {
			emit(int(a.Device), MemvizTraceEntry{Action: action, Addr: a.Addr, Size: a.Size, Frames: f,
				TimeUS: scope.timeUS(ev), orphan: orphan, stack: a.Stack})
		}
		orphan = false
	}
	tensorIn := func(a *ledger.Allocation) bool {
		if !tensors || a.API.Info().Layer != events.LayerTensor {
			return false
		}
		var ok bool
		ok, orphan = scope.covers(a)
		return ok
	}
	for a := range ch.AllFreed() {
		switch {
		case a.API.Segment() && tensors:
			scope.remove(a)
			entries(a, MemvizSegmentFree)
		case a.API.Segment():
			entries(a, MemvizFreeRequested, MemvizFreeCompleted, MemvizSegmentFree)
		case tensorIn(a):
			entries(a, MemvizFreeRequested, MemvizFreeCompleted)
		}
	}
	if a := ch.Alloc; a != nil && a.Before {
		// Live when the trace began: no entry says when it was made
		// (memory_viz, walking back from the snapshot, finds it there).
		if a.API.Segment() && tensors {
			scope.add(a)
		}
	} else if a != nil {
		switch {
		case a.API.Segment() && tensors:
			scope.add(a)
			entries(a, MemvizSegmentAlloc)
		case a.API.Segment():
			entries(a, MemvizSegmentAlloc, MemvizAlloc)
		case tensorIn(a):
			entries(a, MemvizAlloc)
		}
	}
	if ch.Stack != nil && ch.Alloc == nil && events.IsOOM(ev.Result) && ev.API.Segment() {
		free, known := scope.deviceFree(int(ev.Device))
		emit(int(ev.Device), MemvizTraceEntry{Action: MemvizOOM, TimeUS: scope.timeUS(ev), Size: ev.Size, Frames: frames(ch.Stack),
			DeviceFree: free, NoDeviceFree: !known, stack: ch.Stack})
	}
}

// memvizTensorSegment is segment a cut into the blocks of the live tensors
// inside it (sorted by address), each rounded up to PyTorch's 512 bytes
// where room allows, with inactive blocks (cached, free) between them.
func memvizTensorSegment(a *ledger.Allocation, frames []MemvizFrame, live []*ledger.Allocation,
	stack func(*ledger.Stack) []MemvizFrame) MemvizSegment {
	seg := memvizSegment(a, frames)
	seg.Blocks, seg.AllocatedSize, seg.ActiveSize, seg.RequestedSize = nil, 0, 0, 0
	end := a.Addr + a.Size
	at := a.Addr
	i, _ := slices.BinarySearchFunc(live, a.Addr, func(t *ledger.Allocation, addr uint64) int {
		return cmp.Compare(t.Addr, addr)
	})
	for ; i < len(live) && live[i].Addr < end; i++ {
		t := live[i]
		if t.Addr < at || t.Size == 0 {
			continue // overlaps the block before (a free was lost)
		}
		if t.Addr > at {
			seg.Blocks = append(seg.Blocks, MemvizBlock{Address: at, Size: t.Addr - at, State: MemvizInactive})
		}
		size := min((t.Size+511)&^511, end-t.Addr)
		if i+1 < len(live) && live[i+1].Addr > t.Addr {
			size = min(size, max(live[i+1].Addr-t.Addr, min(t.Size, end-t.Addr)))
		}
		req := min(t.Size, size)
		seg.Blocks = append(seg.Blocks, MemvizBlock{Address: t.Addr, Size: size, RequestedSize: req,
			State: MemvizActiveAllocated, Frames: stack(t.Stack)})
		seg.AllocatedSize += size
		seg.ActiveSize += size
		seg.RequestedSize += req
		at = t.Addr + size
	}
	if at < end {
		seg.Blocks = append(seg.Blocks, MemvizBlock{Address: at, Size: end - at, State: MemvizInactive})
	}
	return seg
}

// memvizFramer turns stacks into memory_viz frames, each stack once, and
// streams device traces.
type memvizFramer struct {
	t    *replay.Trace // the first pass: its stacks carry the mappings
	syms *replay.Symbols
	done map[*ledger.Stack][]MemvizFrame
	err  error // the first replay error of a device trace
	// stops end the device replays: all of them, whether or not the
	// encoder got to the end of their lists.
	stops []func()
}

func (m *memvizFramer) close() {
	for _, stop := range m.stops {
		stop()
	}
}

func (m *memvizFramer) frames(st *ledger.Stack) []MemvizFrame {
	if st == nil {
		return nil
	}
	if f, ok := m.done[st]; ok {
		return f
	}
	var out []MemvizFrame
	for _, f := range m.syms.Frames(st) {
		out = append(out, memvizFrame(f))
	}
	m.done[st] = out
	return out
}

// memvizFrame names a frame as memory_viz shows it: the function (or the
// address where it is unknown) in the file and line, else the module.
func memvizFrame(f symbolize.Frame) MemvizFrame {
	name := f.Function
	if name == "" {
		name = fmt.Sprintf("%#x", f.Addr)
	}
	file := f.File
	if file == "" {
		file = f.Module
	}
	return MemvizFrame{Filename: file, Line: int64(f.Line), Name: name}
}

var errStopReplay = errors.New("stop")

// deviceTrace is device dev's trace list: a replay of the trace, pulled
// entry by entry as the encoder writes them. The first skip entries are
// left out, and the list has the n after them (skip+n is the count the
// first pass made).
func (m *memvizFramer) deviceTrace(path string, end uint64, dev int, tensors bool, orphans map[memvizBlockKey]bool,
	skip, n int, opts *Options) pickle.LazyList {
	var next func() (MemvizTraceEntry, bool)
	seq := func(yield func(MemvizTraceEntry) bool) {
		toSkip := skip
		scope := newMemvizScope(func(k memvizBlockKey) bool { return orphans[k] })
		scope.wall = m.t.Meta.WallTime
		_, err := replaySelected(path, end, scope, opts, func(ev *events.Event, ch ledger.Change) error {
			more := true
			memvizEntries(ev, ch, tensors, scope, func(d int, e MemvizTraceEntry) {
				if d != dev || !more {
					return
				}
				if toSkip > 0 {
					toSkip--
					return
				}
				more = yield(e)
			}, func(st *ledger.Stack) []MemvizFrame {
				// This pass's stacks are its own: find the first pass's.
				return m.frames(m.t.Ledger.StackOf(st.PID, st.Frames, st.Tensor))
			})
			if !more {
				return errStopReplay
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStopReplay) && m.err == nil {
			m.err = err
		}
	}
	return pickle.LazyList{Len: n, Item: func(i int) (any, error) {
		if next == nil {
			var stop func()
			next, stop = iter.Pull(seq)
			m.stops = append(m.stops, stop)
		}
		e, ok := next()
		if !ok {
			if m.err != nil {
				return nil, m.err
			}
			return nil, fmt.Errorf("device %d: the trace gave %d entries, the first pass counted %d", dev, skip+i, skip+n)
		}
		if err := e.validate(); err != nil {
			return nil, fmt.Errorf("device %d entry %d: %w", dev, i, err)
		}
		return e.pyValue(), nil
	}}
}

// replaySelected replays the trace at path up to end, feeding scope the
// driver's samples (device_free) and f the events of the processes opts
// selects.
func replaySelected(path string, end uint64, scope *memvizScope, opts *Options, f func(*events.Event, ledger.Change) error) (*replay.Trace, error) {
	return replay.Read(path, replay.Options{Until: end,
		OnNVML: func(s *tracefile.NVML, _ *ledger.Ledger) error {
			scope.nvml(s)
			return nil
		},
		OnEvent: func(ev *events.Event, ch ledger.Change) error {
			if ch.Process == nil || !opts.selected(ch.Process.PID) {
				return nil
			}
			return f(ev, ch)
		}})
}
