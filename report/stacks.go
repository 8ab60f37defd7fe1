package report

// stacks.go: the report's stacks, one entry per call path with both
// levels side by side. PyTorch's caching allocator fires its tensor probe
// (pytorch:malloc) and, when its pool runs dry, calls cudaMalloc from the
// same function: the ledger keeps the two as two stacks (one per level),
// which read the same to a user. Here they are one entry: the tensor bytes
// it used from the pool beside the segment bytes it acquired from the
// device, and the calls of each, as Chainer's CupyMemoryProfileHook shows
// UsedBytes beside AcquiredBytes.

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/pystack"
)

// Stack is what one call path of one process allocated, at both levels.
// Allocs to LiveCount are segments (the runtime's and the driver's
// allocations: GPU memory as the driver holds it, pinned host memory
// included); Tensor* are the tensors a framework's allocator handed out
// of them (0 without its probes).
type Stack struct {
	PID              uint32  `json:"pid"`
	Allocs           uint64  `json:"allocs"`
	AllocBytes       uint64  `json:"alloc_bytes"` // acquired from the device
	LiveBytes        uint64  `json:"live_bytes"`
	LiveCount        uint64  `json:"live_count"`
	TensorAllocs     uint64  `json:"tensor_allocs"`
	TensorAllocBytes uint64  `json:"tensor_alloc_bytes"` // used from the pool
	TensorLiveBytes  uint64  `json:"tensor_live_bytes"`
	TensorLiveCount  uint64  `json:"tensor_live_count"`
	Calls            uint64  `json:"calls"`  // Allocs + TensorAllocs
	Frames           []Frame `json:"frames"` // innermost first
}

// pathKey names a call path by its functions: a named native frame by its
// module and function (the tensor probe and the cudaMalloc call sit at two
// addresses of one function), a Python frame by its file, line and
// function (the user's line, the same in both), an unnamed one by its
// address. Two calls from different lines of one native function are one
// path.
func pathKey(pid uint32, frames []Frame) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", pid)
	for _, f := range frames {
		switch {
		case f.Module == pystack.Module:
			fmt.Fprintf(&b, "\x00py %s:%d %s", f.File, f.Line, f.Function)
		case f.Function != "":
			fmt.Fprintf(&b, "\x00%s %s", f.Module, f.Function)
		default:
			fmt.Fprintf(&b, "\x00%s", f.Address)
		}
	}
	return b.String()
}

// buildStacks makes one entry per call path of the selected processes
// from the ledger's stacks (most live bytes first, segments then tensors,
// then most allocated), and the index of each ledger stack's entry. A
// path's frames are those of its first stack in the ledger's order.
func buildStacks(stacks []*ledger.Stack, selected func(uint32) bool, frames func(*ledger.Stack) []Frame) ([]Stack, map[*ledger.Stack]int) {
	out := []Stack{}
	byKey := map[string]int{}
	of := map[*ledger.Stack]int{}
	for _, st := range stacks {
		if !selected(st.PID) || st.Allocs == 0 {
			continue // only failed calls came from it: they are under failures
		}
		fr := frames(st)
		k := pathKey(st.PID, fr)
		i, ok := byKey[k]
		if !ok {
			i = len(out)
			byKey[k] = i
			out = append(out, Stack{PID: st.PID, Frames: fr})
		}
		of[st] = i
		s := &out[i]
		level := [4]*uint64{&s.Allocs, &s.AllocBytes, &s.LiveBytes, &s.LiveCount}
		if st.Tensor {
			level = [4]*uint64{&s.TensorAllocs, &s.TensorAllocBytes, &s.TensorLiveBytes, &s.TensorLiveCount}
		}
		// Live at the end: an ended process's stacks, what it held at exit.
		for j, v := range [4]uint64{st.Allocs, st.AllocBytes, st.Live + st.HeldAtExit, st.LiveCount + st.HeldAtExitCount} {
			*level[j] += v
		}
		s.Calls = s.Allocs + s.TensorAllocs
	}
	order := make([]int, len(out))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		x, y := &out[a], &out[b]
		return cmp.Or(cmp.Compare(y.LiveBytes, x.LiveBytes), cmp.Compare(y.TensorLiveBytes, x.TensorLiveBytes),
			cmp.Compare(y.AllocBytes, x.AllocBytes), cmp.Compare(y.TensorAllocBytes, x.TensorAllocBytes))
	})
	rank := make([]int, len(out))
	sorted := make([]Stack, len(out))
	for r, i := range order {
		rank[i] = r
		sorted[r] = out[i]
	}
	for st, i := range of {
		of[st] = rank[i]
	}
	return sorted, of
}
