package export

// live.go: the pprof and memviz exports of a live set taken from a ledger
// that keeps running (the agent's), rather than from a trace file replayed.
// The pprof and memviz code paths are the trace exports' own: only where
// the samples and the live set come from differs.

import (
	"io"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/ledger"
)

// LiveProfile is a pprof profile to build from a live ledger.
type LiveProfile struct {
	// Samples: alloc_* counts the allocations the caller chose to count
	// (the agent: those made since the last scrape), inuse_* the live set
	// (Samples.AddLive).
	Samples Samples
	Comm    map[uint32]string // each process's name, for the comm label
	// Labels adds string labels per process (container, pod); empty
	// values are left out.
	Labels   map[uint32]map[string]string
	Time     time.Time     // when the profile was taken
	Duration time.Duration // what alloc_* covers
	Comment  string
}

// WriteLivePprof writes lp as a gzipped pprof profile of the Go heap
// profile's shape, with the labels of WritePprof's (and those of
// lp.Labels), symbolized through src.
func WriteLivePprof(w io.Writer, lp *LiveProfile, src Stacks) error {
	return writeGzipped(w, livePprof(lp, src))
}

// livePprof builds WriteLivePprof's profile (LiveOTLP's too).
func livePprof(lp *LiveProfile, src Stacks) *profile.Profile {
	comm := lp.Comm
	if comm == nil {
		comm = map[uint32]string{}
	}
	p := newPprofBuilder(src, comm, lp.Labels).build(lp.Samples)
	p.TimeNanos = lp.Time.UnixNano()
	p.DurationNanos = int64(lp.Duration)
	if lp.Comment != "" {
		p.Comments = []string{lp.Comment}
	}
	return p
}

// LiveEntry is one entry of a live snapshot's device trace.
type LiveEntry struct {
	Action MemvizAction
	Addr   uint64
	Size   uint64
	Device int32
	Stack  *ledger.Stack // nil: no frames
	TimeUS int64         // Unix epoch µs; 0 leaves time_us out
	// DeviceFree, for oom: the device's free memory then (the driver's,
	// NVML); nil where it is unknown, and device_free is left out.
	DeviceFree *uint64
}

// LiveSnapshot builds one process's memory snapshot from its live set:
// segments are its live allocations (pinned host memory is left out: it is
// not device memory) and its VMM mappings (its cuMemCreate memory drawn
// where it is mapped), cut into the blocks of its live tensors when
// tensors is set (the process has PyTorch's tensor events), as
// WriteMemvizTrace does. The three lists are by address, as ledger.Process
// returns them. trace becomes device_traces, in order. The snapshot is
// validated.
func LiveSnapshot(segments []*ledger.Allocation, mappings []*ledger.Mapping, liveTensors []*ledger.Allocation, tensors bool,
	trace []LiveEntry, src Stacks) (*Snapshot, error) {
	done := map[*ledger.Stack][]MemvizFrame{}
	frames := func(st *ledger.Stack) []MemvizFrame {
		if st == nil {
			return nil
		}
		if f, ok := done[st]; ok {
			return f
		}
		var out []MemvizFrame
		for _, f := range src.Frames(st) {
			out = append(out, memvizFrame(f))
		}
		done[st] = out
		return out
	}
	// Tensors in segments made before the agent attached get their own
	// segments, so no live tensor is dropped.
	snap := &Snapshot{Segments: memvizSegments(segments, mappings, liveTensors, tensors, frames).segs}
	maxDev := -1
	for i := range snap.Segments {
		maxDev = max(maxDev, snap.Segments[i].Device)
	}
	for _, e := range trace {
		maxDev = max(maxDev, int(e.Device))
	}
	snap.DeviceTraces = make([][]MemvizTraceEntry, maxDev+1)
	for _, e := range trace {
		if e.Device < 0 {
			continue
		}
		entry := MemvizTraceEntry{Action: e.Action, Addr: e.Addr, Size: e.Size, Frames: frames(e.Stack), TimeUS: e.TimeUS,
			NoDeviceFree: e.DeviceFree == nil}
		if e.DeviceFree != nil {
			entry.DeviceFree = *e.DeviceFree
		}
		snap.DeviceTraces[e.Device] = append(snap.DeviceTraces[e.Device], entry)
	}
	if err := snap.Validate(); err != nil {
		return nil, err
	}
	return snap, nil
}
