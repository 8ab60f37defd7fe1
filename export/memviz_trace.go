package export

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/pickle"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The sizes PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp)
// is built on.
const (
	// memvizSmallSize is kSmallSize: requests up to it are served from the
	// small pool, larger ones from the large pool; and a large-pool block is
	// split only when more than this is left past the request
	// (should_split), so no free block of the large pool is this small.
	memvizSmallSize = 1 << 20
	// memvizSmallBuffer is kSmallBuffer: the size of a small-pool segment,
	// and of each mapping of a small expandable segment. Large-pool
	// segments are 10 MiB or more (kMinLargeAlloc), mapped in 20 MiB
	// pages (kLargeBuffer) when expandable.
	memvizSmallBuffer = 2 << 20
	// memvizRound is kMinBlockSize: every block's size is a multiple of it.
	memvizRound = 512
)

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
// VMM memory (cuMemCreate) has no address of its own, only a handle: it is
// drawn where cuMemMap mapped it, as PyTorch draws an expandable segment,
// one segment (is_expandable) per run of adjacent mappings, and its trace
// entries are segment_map and segment_unmap at the mapped address.
// Physical memory mapped nowhere at the moment is left out, and opts.Warn
// says how much.
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
		return fmt.Errorf("a memory snapshot is one process's, and this trace has %d: %s", len(pids), pickOne(t, pids))
	}

	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	fr := &memvizFramer{t: t, syms: syms, done: map[*ledger.Stack][]MemvizFrame{}}
	defer fr.close()

	snap := &Snapshot{}
	orphans := map[memvizBlockKey]bool{}
	var left memvizLeftOut
	for _, pid := range pids {
		p := t.Ledger.Process(pid)
		// An ended process: what it held at exit is its live set at the
		// end (the trace has no free for it: memviz walks back from here).
		// Its mappings stay as they were at its end.
		atEnd, live := p.AtEnd() // by address
		l := memvizSegments(atEnd, p.Mappings(), live, tensors, fr.frames)
		snap.Segments = append(snap.Segments, l.segs...)
		for _, seg := range l.orphans {
			orphans[memvizBlockKey{seg.Device, seg.Address, seg.TotalSize}] = true
		}
		left.add(l.left)
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
	// One trace list per device 0..max, as PyTorch writes them; Validate
	// checks the segments against them.
	snap.DeviceTraces = make([][]MemvizTraceEntry, maxDev+1)
	if err := snap.Validate(); err != nil {
		return err
	}

	limit := opts.MemvizEntries // from here on: > 0 a cap, 0 no trace, < 0 no cap
	switch limit {
	case 0:
		limit = DefaultMemvizEntries
	case MemvizNoTrace:
		limit = 0
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
		if limit >= 0 && counts[dev] > limit {
			settings.Overflowed = true
		}
	}
	traces := pickle.LazyList{Len: maxDev + 1, Item: func(dev int) (any, error) {
		n := counts[dev]
		if limit == 0 {
			return []any{}, nil // no replay only to skip it all
		}
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
	left.warn(&opts)
	return nil
}

// memvizLeftOut counts the live memory a snapshot leaves out: that on an
// unknown device, as memory_viz draws devices, and a thread that chose its
// device before tracing began allocated on events.DeviceUnknown until it
// said which (its trace entries go to no device's list either); and VMM
// physical memory with no mapping the trace saw, which has no address to
// draw it at.
type memvizLeftOut struct {
	unknown, unknownBytes   uint64
	unmapped, unmappedBytes uint64
}

func (l *memvizLeftOut) add(o memvizLeftOut) {
	l.unknown += o.unknown
	l.unknownBytes += o.unknownBytes
	l.unmapped += o.unmapped
	l.unmappedBytes += o.unmappedBytes
}

func (l *memvizLeftOut) warn(o *Options) {
	if o.Warn == nil {
		return
	}
	if l.unknown > 0 {
		o.Warn(fmt.Sprintf("memviz: %d live allocations (%s) on an unknown device left out (threads that chose their device before tracing began; `cudatrace report` counts them)",
			l.unknown, units.Bytes(l.unknownBytes)))
	}
	if l.unmapped > 0 {
		o.Warn(fmt.Sprintf("memviz: %d VMM allocations (%s, cuMemCreate) not mapped at the moment left out: physical memory has an address only where cuMemMap maps it, and the trace saw no map of these (`cudatrace report` counts them)",
			l.unmapped, units.Bytes(l.unmappedBytes)))
	}
}

// memvizLayout is one process's memory as a snapshot lists it.
type memvizLayout struct {
	segs    []MemvizSegment // by address, orphans among them
	orphans []MemvizSegment // live tensors' own segments (orphanSegments)
	left    memvizLeftOut
}

// memvizSegments lays out one process's memory (its live allocations and
// VMM mappings, both by address) as snapshot segments: each segment
// allocation one, VMM memory one per run of adjacent mappings
// (memvizMapped); with tensors, cut into the live tensors' blocks
// (memvizTensorSegment), with a segment of their own for tensors in none
// (orphanSegments).
func memvizSegments(allocs []*ledger.Allocation, maps []*ledger.Mapping, live []*ledger.Allocation, tensors bool,
	frames func(*ledger.Stack) []MemvizFrame) memvizLayout {
	var l memvizLayout
	for _, a := range allocs {
		switch {
		case !a.API.Segment():
		case a.API == events.CuMemCreate:
			// Its Addr is a handle: its mappings below say where it is.
			if !a.Mapped() {
				l.left.unmapped++
				l.left.unmappedBytes += a.Size
			}
		case a.Device == events.DeviceUnknown:
			l.left.unknown++
			l.left.unknownBytes += a.Size
		default:
			l.segs = append(l.segs, memvizSegment(a, frames(a.Stack)))
		}
	}
	var known []*ledger.Mapping
	for _, m := range maps {
		if m.Device == events.DeviceUnknown {
			l.left.unknown++
			l.left.unknownBytes += m.Size
			continue
		}
		known = append(known, m)
	}
	l.segs = append(l.segs, memvizMapped(known, frames)...)
	if tensors {
		for i := range l.segs {
			l.segs[i] = memvizTensorSegment(l.segs[i], live, frames)
		}
		l.orphans = orphanSegments(l.segs, live, frames)
		l.segs = append(l.segs, l.orphans...)
	}
	slices.SortStableFunc(l.segs, func(a, b MemvizSegment) int { return cmp.Compare(a.Address, b.Address) })
	return l
}

// memvizMapped makes a segment of each run of adjacent VMM mappings (by
// address) on one device, as PyTorch's snapshot lists an expandable
// segment: one segment per contiguous mapped range, is_expandable. Each
// mapping is one active block of it; tensors cut it up instead. A run of
// small pages (kSmallBuffer) is the small pool's.
func memvizMapped(maps []*ledger.Mapping, frames func(*ledger.Stack) []MemvizFrame) []MemvizSegment {
	var out []MemvizSegment
	for i := 0; i < len(maps); {
		m := maps[i]
		seg := MemvizSegment{Device: int(m.Device), Address: m.Addr, SegmentType: MemvizSmall, IsExpandable: true,
			Frames: frames(m.Stack())}
		for ; i < len(maps) && maps[i].Device == m.Device && maps[i].Addr == m.Addr+seg.TotalSize; i++ {
			b := maps[i]
			seg.Blocks = append(seg.Blocks, MemvizBlock{Address: b.Addr, Size: b.Size, RequestedSize: b.Size,
				State: MemvizActiveAllocated, Frames: frames(b.Stack())})
			seg.TotalSize += b.Size
			if b.Size > memvizSmallBuffer {
				seg.SegmentType = MemvizLarge
			}
		}
		seg.AllocatedSize, seg.ActiveSize, seg.RequestedSize = seg.TotalSize, seg.TotalSize, seg.TotalSize
		out = append(out, seg)
	}
	return out
}

// memvizSegment is allocation a as a segment of one active block. One of
// kSmallBuffer or less is taken for the small pool's, as PyTorch makes no
// smaller segment for its large pool.
func memvizSegment(a *ledger.Allocation, frames []MemvizFrame) MemvizSegment {
	kind := MemvizLarge
	if a.Size <= memvizSmallBuffer {
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
// have entries of their own. VMM memory has its entries where it is
// mapped, as PyTorch's expandable segments do: segment_map and
// segment_unmap at the mapping's address and size (each mapping also a
// block without tensors); creating and releasing it makes none, as it has
// no address then.
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
	emitAt := func(dev int32, addr, size uint64, st *ledger.Stack, actions ...MemvizAction) {
		f := frames(st)
		for _, action := range actions {
			emit(int(dev), MemvizTraceEntry{Action: action, Addr: addr, Size: size, Frames: f,
				TimeUS: scope.timeUS(ev), orphan: orphan, stack: st})
		}
		orphan = false
	}
	entries := func(a *ledger.Allocation, actions ...MemvizAction) {
		emitAt(a.Device, a.Addr, a.Size, a.Stack, actions...)
	}
	mapping := func(m *ledger.Mapping, actions ...MemvizAction) {
		emitAt(m.Device, m.Addr, m.Size, m.Stack(), actions...)
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
		case a.API == events.CuMemCreate: // a handle, no address
		case a.API.Segment() && tensors:
			scope.remove(int(a.Device), a.Addr)
			entries(a, MemvizSegmentFree)
		case a.API.Segment():
			entries(a, MemvizFreeRequested, MemvizFreeCompleted, MemvizSegmentFree)
		case tensorIn(a):
			entries(a, MemvizFreeRequested, MemvizFreeCompleted)
		}
	}
	for _, m := range ch.Unmapped {
		if tensors {
			scope.remove(int(m.Device), m.Addr)
			mapping(m, MemvizSegmentUnmap)
		} else {
			mapping(m, MemvizFreeRequested, MemvizFreeCompleted, MemvizSegmentUnmap)
		}
	}
	if a := ch.Alloc; a != nil && a.Before {
		// Live when the trace began: no entry says when it was made
		// (memory_viz, walking back from the snapshot, finds it there).
		if a.API.Segment() && a.API != events.CuMemCreate && tensors {
			scope.add(int(a.Device), a.Addr, a.Size)
		}
	} else if a != nil {
		switch {
		case a.API == events.CuMemCreate:
		case a.API.Segment() && tensors:
			scope.add(int(a.Device), a.Addr, a.Size)
			entries(a, MemvizSegmentAlloc)
		case a.API.Segment():
			entries(a, MemvizSegmentAlloc, MemvizAlloc)
		case tensorIn(a):
			entries(a, MemvizAlloc)
		}
	}
	if m := ch.Mapped; m != nil {
		if tensors {
			scope.add(int(m.Device), m.Addr, m.Size)
			mapping(m, MemvizSegmentMap)
		} else {
			mapping(m, MemvizSegmentMap, MemvizAlloc)
		}
	}
	if ch.Stack != nil && ch.Alloc == nil && events.IsOOM(ev.Result) && ev.API.Segment() {
		free, known := scope.deviceFree(int(ev.Device))
		emit(int(ev.Device), MemvizTraceEntry{Action: MemvizOOM, TimeUS: scope.timeUS(ev), Size: ev.Size, Frames: frames(ch.Stack),
			DeviceFree: free, NoDeviceFree: !known, stack: ch.Stack})
	}
}

// memvizTensorSegment cuts seg into the blocks of the live tensors inside
// it (live by address), with inactive blocks (cached, free) between them.
//
// A tensor's block is its size rounded up to PyTorch's 512 bytes, where
// room allows. In a large-pool segment that is not expandable, the block
// also takes what is left up to the next live tensor, or the segment's
// end, when that is 1 MiB (kSmallSize) or less: the caching allocator
// splits a large-pool block only when more than that would remain
// (should_split), so no free block is that small there, and the tensor got
// the whole block (memory_allocated counts it). Small-pool and expandable
// blocks split at any remainder of 512 bytes or more: theirs are rounded
// only. A block larger than its tensor by more than 1 MiB is not told from
// a free block after it: the allocator keeps such only for oversize
// requests (max_split_size_mb set), which the trace does not tell.
func memvizTensorSegment(seg MemvizSegment, live []*ledger.Allocation, stack func(*ledger.Stack) []MemvizFrame) MemvizSegment {
	seg.Blocks, seg.AllocatedSize, seg.ActiveSize, seg.RequestedSize = nil, 0, 0, 0
	unsplit := seg.SegmentType == MemvizLarge && !seg.IsExpandable
	end := seg.Address + seg.TotalSize
	at := seg.Address
	i, _ := slices.BinarySearchFunc(live, seg.Address, func(t *ledger.Allocation, addr uint64) int {
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
		size := min((t.Size+memvizRound-1)&^(memvizRound-1), end-t.Addr)
		if i+1 < len(live) && live[i+1].Addr > t.Addr {
			size = min(size, max(live[i+1].Addr-t.Addr, min(t.Size, end-t.Addr)))
		}
		if unsplit {
			next := end // the next block that can start: a live tensor's, or the end
			for j := i + 1; j < len(live) && live[j].Addr < end; j++ {
				if live[j].Addr >= t.Addr+size && live[j].Size > 0 {
					next = live[j].Addr
					break
				}
			}
			if rest := next - (t.Addr + size); rest <= memvizSmallSize {
				size += rest
			}
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
