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

// Values are one sample's values, in the order and with the meaning of
// the Go heap profile's sample types: alloc_objects, alloc_space,
// inuse_objects, inuse_space.
type Values [4]int64

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

// AddLive counts live allocations in inuse_*, one sample per stack,
// device and function: a process's live set is its LiveAllocations (the
// segments, pinned host memory among them) and its LiveTensors.
func (s Samples) AddLive(sets ...[]*ledger.Allocation) {
	for _, set := range sets {
		for _, a := range set {
			v := s.At(KeyOf(a))
			v[2]++
			v[3] += int64(a.Size)
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
