package export

import (
	"cmp"
	"slices"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
)

// SampleKey is what one pprof sample aggregates: one stack of one process
// (a ledger stack is per process), one device, one function.
type SampleKey struct {
	Stack  *ledger.Stack
	Device int32
	API    events.API
}

// KeyOf is the sample a counts in.
func KeyOf(a *ledger.Allocation) SampleKey { return SampleKey{a.Stack, a.Device, a.API} }

// Values are one sample's values, one column per pprof sample type
// (pprofSampleTypes): three groups of the Go heap profile's four,
// alloc_objects, alloc_space, inuse_objects, inuse_space. The first group,
// the one pprof shows by default, is GPU memory as the driver holds it:
// segments (the runtime's and the driver's allocations), so its
// inuse_space totals what the report calls GPU live. The second, tensor_*,
// is the blocks a framework's allocator cuts from those segments (PyTorch's
// tensors): counted apart, as they lie inside the segments, never added to
// them. The third, host_*, is pinned host memory, which is not GPU memory.
// A sample is one API's, so only its class's group is set.
type Values [3 * 4]int64

// Classes: which group of Values a sample's API fills.
const (
	classGPU    = 0
	classTensor = 1
	classHost   = 2
)

func classOf(api events.API) int {
	info := api.Info()
	switch {
	case info.Layer == events.LayerTensor:
		return classTensor
	case info.Kind == events.KindHost:
		return classHost
	}
	return classGPU
}

// Samples are a heap profile's samples, by key. A trace's profile
// (WritePprof), the agent's live one and its OOM dump's are all built as
// Samples: AddLive is the one way a live set becomes inuse_*.
type Samples map[SampleKey]*Values

// At returns k's values, zero the first time.
func (s Samples) At(k SampleKey) *Values {
	v := s[k]
	if v == nil {
		v = new(Values)
		s[k] = v
	}
	return v
}

// AddAlloc counts n allocations of bytes in all in k's alloc_* (of its
// class: see Values).
func (s Samples) AddAlloc(k SampleKey, n, bytes int64) {
	v, c := s.At(k), 4*classOf(k.API)
	v[c] += n
	v[c+1] += bytes
}

// AddLive counts live allocations in inuse_* (of their class: see Values),
// one sample per stack, device and function: a process's live set is its
// LiveAllocations (the segments, pinned host memory among them) and its
// LiveTensors.
func (s Samples) AddLive(sets ...[]*ledger.Allocation) {
	for _, set := range sets {
		for _, a := range set {
			v, c := s.At(KeyOf(a)), 4*classOf(a.API)
			v[c+2]++
			v[c+3] += int64(a.Size)
		}
	}
}

// sorted returns s's keys in a stable order: the same samples always write
// the same profile.
func (s Samples) sorted() []SampleKey {
	keys := make([]SampleKey, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b SampleKey) int {
		return cmp.Or(cmp.Compare(a.Stack.PID, b.Stack.PID), slices.Compare(a.Stack.Frames, b.Stack.Frames),
			cmp.Compare(a.Device, b.Device), cmp.Compare(a.API, b.API))
	})
	return keys
}
