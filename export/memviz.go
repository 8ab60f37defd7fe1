package export

// memviz.go: the data model of a PyTorch CUDA memory snapshot, the dict that
// torch.cuda.memory._snapshot() returns and _dump_snapshot() pickles, and its
// writer. Three readers take the file: pytorch.org/memory_viz
// (torch/utils/viz/MemoryViz.js), `python -m torch.cuda._memory_viz`
// (torch/cuda/_memory_viz.py) and plain pickle.load. Field names and value
// types follow PyTorch's own writers, THCPModule_memorySnapshot in
// torch/csrc/cuda/Module.cpp and _memory_snapshot_pickled in
// torch/csrc/cuda/memory_snapshot.cpp; keys come in the order those insert
// them (no reader depends on it). Newer PyTorch adds an
// "allocator_settings" dict, which no viewer reads; it is not written.
//
// What the readers rely on, and Validate checks:
//   - a segment's blocks tile it: MemoryViz.js does not read a block's
//     address but recomputes it as the segment's address plus the sizes of
//     the blocks before it (annotate_snapshot), and _memory_viz.py's stats
//     asserts the block sizes add up to total_size;
//   - device_traces[d] exists for every device d a segment is on:
//     MemoryViz.js indexes snapshot.device_traces[device] unguarded;
//   - every number is below 2^53, as JS holds it in a float64.

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/internal/pickle"
	"github.com/cudatrace/cudatrace/ledger"
)

// ErrInvalidSnapshot wraps every error Validate returns.
var ErrInvalidSnapshot = errors.New("memviz: invalid snapshot")

// Snapshot is a PyTorch memory snapshot: the segments the allocator holds at
// one moment, and per device the events that led there.
type Snapshot struct {
	Segments []MemvizSegment
	// DeviceTraces[d] lists device d's events, oldest first. It needs an
	// entry (possibly empty) for every device a segment is on.
	DeviceTraces [][]MemvizTraceEntry
}

// MemvizSegment is one segment: memory reserved with one cudaMalloc (or one
// mapping of an expandable segment), cut into blocks.
type MemvizSegment struct {
	Device  int
	Address uint64
	// TotalSize is the segment's size; the blocks' sizes add up to it.
	TotalSize uint64
	// AllocatedSize is the sum of the sizes of its active_allocated blocks;
	// ActiveSize adds the active_pending_free ones; RequestedSize is the sum
	// of requested_size over the same (active) blocks. These are the sums
	// CUDACachingAllocator's snapshot() makes, and Validate checks them.
	AllocatedSize uint64
	ActiveSize    uint64
	RequestedSize uint64
	// Stream is the cudaStream_t value, 0 for the default stream.
	Stream      uint64
	SegmentType MemvizSegmentType
	// PoolID is segment_pool_id, the (id, id) pair of the private pool
	// (CUDA graph or MemPool) that owns the segment; (0, 0) for the default
	// pool. Written as a 2-tuple, as PyTorch does.
	PoolID       [2]int64
	IsExpandable bool
	Frames       []MemvizFrame // where the segment was allocated; may be empty
	// Blocks tile the segment: sorted by address, the first at Address,
	// each starting where the previous ends.
	Blocks []MemvizBlock
}

// MemvizSegmentType is segment_type: which of the allocator's pools the
// segment is in.
type MemvizSegmentType string

// Segment types.
const (
	MemvizLarge MemvizSegmentType = "large"
	MemvizSmall MemvizSegmentType = "small"
)

// MemvizBlock is one piece of a segment, in use or free.
type MemvizBlock struct {
	Address uint64
	Size    uint64
	// RequestedSize is what the program asked for, at most Size (the
	// allocator rounds up).
	RequestedSize uint64
	State         MemvizBlockState
	Frames        []MemvizFrame // where the block was allocated; may be empty
}

// MemvizBlockState is a block's state.
type MemvizBlockState string

// Block states, as PyTorch names them.
const (
	// MemvizActiveAllocated: in use by the program.
	MemvizActiveAllocated MemvizBlockState = "active_allocated"
	// MemvizActivePendingFree: freed by the program, but a stream that
	// used it has not finished (record_stream), so not yet reusable.
	MemvizActivePendingFree MemvizBlockState = "active_pending_free"
	// MemvizInactive: free, cached by the allocator.
	MemvizInactive MemvizBlockState = "inactive"
)

// MemvizFrame is one frame of a stack, innermost first in a list.
type MemvizFrame struct {
	Filename string
	Line     int64
	Name     string
}

// MemvizTraceEntry is one allocator event.
type MemvizTraceEntry struct {
	Action MemvizAction
	// Addr is the block's (alloc, free_*) or the segment's (segment_*)
	// address. It is not written for oom, which has DeviceFree in its
	// place, as PyTorch writes it.
	Addr uint64
	Size uint64 // bytes; for oom the size that failed
	// Stream is the cudaStream_t value, 0 for the default stream.
	Stream uint64
	Frames []MemvizFrame // may be empty
	// DeviceFree is the bytes free on the device when an oom happened;
	// written for oom only, unless NoDeviceFree says it is unknown (the
	// snapshot's allocator_settings say why).
	DeviceFree   uint64
	NoDeviceFree bool
	// TimeUS is when the event happened, in microseconds (PyTorch uses the
	// Unix epoch). Zero leaves "time_us" out, as older PyTorch did.
	TimeUS int64

	orphan bool          // a block in no segment the trace saw (memvizScope)
	stack  *ledger.Stack // whose Frames these are (HistoryEntries keeps it, not the frames)
}

// MemvizAction is a trace entry's action.
type MemvizAction string

// Actions, as PyTorch names them.
const (
	MemvizAlloc         MemvizAction = "alloc"          // block handed to the program
	MemvizFreeRequested MemvizAction = "free_requested" // program freed it
	MemvizFreeCompleted MemvizAction = "free_completed" // reusable (streams done)
	MemvizSegmentAlloc  MemvizAction = "segment_alloc"  // cudaMalloc
	MemvizSegmentFree   MemvizAction = "segment_free"   // cudaFree
	MemvizSegmentMap    MemvizAction = "segment_map"    // expandable segment grew
	MemvizSegmentUnmap  MemvizAction = "segment_unmap"  // expandable segment shrank
	MemvizOOM           MemvizAction = "oom"            // allocation failed
	MemvizSnapshotTaken MemvizAction = "snapshot"       // the snapshot was taken here
)

var (
	memvizActions = []MemvizAction{MemvizAlloc, MemvizFreeRequested, MemvizFreeCompleted,
		MemvizSegmentAlloc, MemvizSegmentFree, MemvizSegmentMap, MemvizSegmentUnmap,
		MemvizOOM, MemvizSnapshotTaken}
	memvizStates = []MemvizBlockState{MemvizActiveAllocated, MemvizActivePendingFree, MemvizInactive}
)

// WriteMemviz checks s (see Validate) and writes it to w as a pickle that
// pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` open. Nothing
// is written when s is invalid. Frame strings that are not valid UTF-8 get
// U+FFFD in place of the bad bytes, as they are only shown, and CPython would
// refuse the whole file over one of them.
func WriteMemviz(w io.Writer, s *Snapshot) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if err := pickle.NewEncoder(w).Encode(s.pyValue()); err != nil {
		return fmt.Errorf("memviz: %w", err)
	}
	return nil
}

// Validate checks what the readers of a snapshot rely on and returns an
// error, wrapping ErrInvalidSnapshot, that names the first broken rule:
//   - every segment's device has a list in DeviceTraces;
//   - segment_type, block states and actions are ones PyTorch writes;
//   - a segment is not empty, and its blocks tile it: the first starts at
//     the segment's address, each next one where the one before ends, none
//     is empty, and their sizes add up to TotalSize;
//   - no block's RequestedSize exceeds its Size;
//   - AllocatedSize, ActiveSize and RequestedSize are the sums described on
//     MemvizSegment;
//   - segments on one device do not overlap;
//   - every int is at most pickle.MaxSafeInt, and so is a segment's end address.
func (s *Snapshot) Validate() error {
	if s == nil {
		return fmt.Errorf("%w: nil snapshot", ErrInvalidSnapshot)
	}
	type span struct{ start, end uint64 }
	perDevice := map[int][]span{}
	for i := range s.Segments {
		seg := &s.Segments[i]
		if err := seg.validate(len(s.DeviceTraces)); err != nil {
			return fmt.Errorf("%w: segment %d at %#x on device %d: %w", ErrInvalidSnapshot, i, seg.Address, seg.Device, err)
		}
		perDevice[seg.Device] = append(perDevice[seg.Device], span{seg.Address, seg.Address + seg.TotalSize})
	}
	devices := make([]int, 0, len(perDevice))
	for dev := range perDevice {
		devices = append(devices, dev)
	}
	slices.Sort(devices) // so the error names the same pair every run
	for _, dev := range devices {
		spans := perDevice[dev]
		slices.SortFunc(spans, func(a, b span) int {
			switch {
			case a.start < b.start:
				return -1
			case a.start > b.start:
				return 1
			}
			return 0
		})
		for j := 1; j < len(spans); j++ {
			if spans[j].start < spans[j-1].end {
				return fmt.Errorf("%w: device %d: segments %#x-%#x and %#x-%#x overlap", ErrInvalidSnapshot,
					dev, spans[j-1].start, spans[j-1].end, spans[j].start, spans[j].end)
			}
		}
	}
	for d, trace := range s.DeviceTraces {
		for j := range trace {
			if err := trace[j].validate(); err != nil {
				return fmt.Errorf("%w: device_traces[%d][%d] (%s): %w", ErrInvalidSnapshot, d, j, trace[j].Action, err)
			}
		}
	}
	return nil
}

func (seg *MemvizSegment) validate(nTraces int) error {
	if seg.Device < 0 {
		return errors.New("device is negative")
	}
	if seg.Device >= nTraces {
		return fmt.Errorf("device_traces has %d lists, but needs one per device 0..%d", nTraces, seg.Device)
	}
	if seg.SegmentType != MemvizLarge && seg.SegmentType != MemvizSmall {
		return fmt.Errorf("segment_type %q is neither %q nor %q", seg.SegmentType, MemvizLarge, MemvizSmall)
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{
		{"address", seg.Address}, {"total_size", seg.TotalSize}, {"allocated_size", seg.AllocatedSize},
		{"active_size", seg.ActiveSize}, {"requested_size", seg.RequestedSize}, {"stream", seg.Stream},
	} {
		if err := memvizUint(f.name, f.v); err != nil {
			return err
		}
	}
	for k, id := range seg.PoolID {
		if err := memvizInt(fmt.Sprintf("segment_pool_id[%d]", k), id); err != nil {
			return err
		}
	}
	if seg.TotalSize == 0 {
		return errors.New("total_size is 0")
	}
	if seg.Address+seg.TotalSize > pickle.MaxSafeInt+1 {
		return fmt.Errorf("ends at %#x, past 2^53: %w", seg.Address+seg.TotalSize, pickle.ErrUnsafeInt)
	}
	if err := memvizFramesOK(seg.Frames); err != nil {
		return err
	}
	var covered, allocated, active, requested uint64
	for j := range seg.Blocks {
		b := &seg.Blocks[j]
		if err := b.validate(); err != nil {
			return fmt.Errorf("block %d at %#x: %w", j, b.Address, err)
		}
		if b.Address != seg.Address+covered {
			return fmt.Errorf("block %d starts at %#x, want %#x (blocks must be sorted and contiguous from the segment's address)",
				j, b.Address, seg.Address+covered)
		}
		covered += b.Size
		if covered > seg.TotalSize {
			return fmt.Errorf("blocks 0..%d cover %d bytes, more than total_size %d", j, covered, seg.TotalSize)
		}
		switch b.State {
		case MemvizActiveAllocated:
			allocated += b.Size
			fallthrough
		case MemvizActivePendingFree:
			active += b.Size
			requested += b.RequestedSize
		}
	}
	if covered != seg.TotalSize {
		return fmt.Errorf("blocks cover %d of %d bytes", covered, seg.TotalSize)
	}
	if seg.AllocatedSize != allocated {
		return fmt.Errorf("allocated_size is %d, but its active_allocated blocks add up to %d", seg.AllocatedSize, allocated)
	}
	if seg.ActiveSize != active {
		return fmt.Errorf("active_size is %d, but its active blocks add up to %d", seg.ActiveSize, active)
	}
	if seg.RequestedSize != requested {
		return fmt.Errorf("requested_size is %d, but its active blocks' requested_size add up to %d", seg.RequestedSize, requested)
	}
	return nil
}

func (b *MemvizBlock) validate() error {
	if err := cmp.Or(memvizIn("state", b.State, memvizStates),
		memvizUints(memvizField{"address", b.Address}, memvizField{"size", b.Size}, memvizField{"requested_size", b.RequestedSize})); err != nil {
		return err
	}
	if b.Size == 0 {
		return errors.New("size is 0")
	}
	if b.RequestedSize > b.Size {
		return fmt.Errorf("requested_size %d exceeds size %d", b.RequestedSize, b.Size)
	}
	return memvizFramesOK(b.Frames)
}

func (t *MemvizTraceEntry) validate() error {
	if err := cmp.Or(memvizIn("action", t.Action, memvizActions),
		memvizUints(memvizField{"addr", t.Addr}, memvizField{"size", t.Size}, memvizField{"stream", t.Stream}, memvizField{"device_free", t.DeviceFree})); err != nil {
		return err
	}
	if err := memvizInt("time_us", t.TimeUS); err != nil {
		return err
	}
	return memvizFramesOK(t.Frames)
}

func memvizFramesOK(frames []MemvizFrame) error {
	for k := range frames {
		if err := memvizInt(fmt.Sprintf("frames[%d].line", k), frames[k].Line); err != nil {
			return err
		}
	}
	return nil
}

// memvizIn checks that v is one of the values the viewer knows.
func memvizIn[T ~string](what string, v T, known []T) error {
	if !slices.Contains(known, v) {
		return fmt.Errorf("%s %q is not one of %q", what, v, known)
	}
	return nil
}

// memvizField is a named unsigned field, for memvizUints.
type memvizField struct {
	name string
	v    uint64
}

// memvizUints checks each field with memvizUint.
func memvizUints(fields ...memvizField) error {
	for _, f := range fields {
		if err := memvizUint(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

func memvizUint(name string, v uint64) error {
	if v > pickle.MaxSafeInt {
		return fmt.Errorf("%s %d: %w", name, v, pickle.ErrUnsafeInt)
	}
	return nil
}

func memvizInt(name string, v int64) error {
	if v > pickle.MaxSafeInt || v < -pickle.MaxSafeInt {
		return fmt.Errorf("%s %d: %w", name, v, pickle.ErrUnsafeInt)
	}
	return nil
}

// pyValue is the snapshot as the dict PyTorch builds, keys in PyTorch's
// order. The lists are lazy, so only one record's dict exists at a time
// while writing.
func (s *Snapshot) pyValue() pickle.Dict {
	segments := pickle.LazyList{Len: len(s.Segments), Item: func(i int) (any, error) {
		return s.Segments[i].pyValue(), nil
	}}
	traces := pickle.LazyList{Len: len(s.DeviceTraces), Item: func(d int) (any, error) {
		trace := s.DeviceTraces[d]
		return pickle.LazyList{Len: len(trace), Item: func(j int) (any, error) {
			return trace[j].pyValue(), nil
		}}, nil
	}}
	return pickle.Dict{{Key: "segments", Value: segments}, {Key: "device_traces", Value: traces}}
}

func (seg *MemvizSegment) pyValue() pickle.Dict {
	blocks := pickle.LazyList{Len: len(seg.Blocks), Item: func(j int) (any, error) {
		b := &seg.Blocks[j]
		return pickle.Dict{
			{Key: "address", Value: b.Address},
			{Key: "size", Value: b.Size},
			{Key: "requested_size", Value: b.RequestedSize},
			{Key: "state", Value: string(b.State)},
			{Key: "frames", Value: memvizFrames(b.Frames)},
		}, nil
	}}
	return pickle.Dict{
		{Key: "device", Value: seg.Device},
		{Key: "address", Value: seg.Address},
		{Key: "total_size", Value: seg.TotalSize},
		{Key: "allocated_size", Value: seg.AllocatedSize},
		{Key: "active_size", Value: seg.ActiveSize},
		{Key: "requested_size", Value: seg.RequestedSize},
		{Key: "stream", Value: seg.Stream},
		{Key: "segment_type", Value: string(seg.SegmentType)},
		{Key: "segment_pool_id", Value: pickle.Tuple{seg.PoolID[0], seg.PoolID[1]}},
		{Key: "is_expandable", Value: seg.IsExpandable},
		{Key: "frames", Value: memvizFrames(seg.Frames)},
		{Key: "blocks", Value: blocks},
	}
}

func (t *MemvizTraceEntry) pyValue() pickle.Dict {
	d := make(pickle.Dict, 0, 6)
	d = append(d, pickle.KV{Key: "action", Value: string(t.Action)})
	if t.Action == MemvizOOM && !t.NoDeviceFree {
		d = append(d, pickle.KV{Key: "device_free", Value: t.DeviceFree})
	} else {
		d = append(d, pickle.KV{Key: "addr", Value: t.Addr})
	}
	d = append(d, pickle.KV{Key: "size", Value: t.Size}, pickle.KV{Key: "stream", Value: t.Stream})
	if t.TimeUS != 0 {
		d = append(d, pickle.KV{Key: "time_us", Value: t.TimeUS})
	}
	return append(d, pickle.KV{Key: "frames", Value: memvizFrames(t.Frames)})
}

// memvizFrames writes frames with PyTorch's keys and key order. Always a
// list, even empty: a block without "frames" is read as the legacy format.
func memvizFrames(frames []MemvizFrame) pickle.LazyList {
	return pickle.LazyList{Len: len(frames), Item: func(k int) (any, error) {
		f := &frames[k]
		return pickle.Dict{
			{Key: "name", Value: strings.ToValidUTF8(f.Name, "\uFFFD")},
			{Key: "filename", Value: strings.ToValidUTF8(f.Filename, "\uFFFD")},
			{Key: "line", Value: f.Line},
		}, nil
	}}
}
