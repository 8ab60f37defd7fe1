package ledger

import (
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// BenchmarkDecodeApply is the user-space cost of one event in `record`:
// decode the ring-buffer record, then account for it in the ledger. Half the
// events allocate (20-frame stacks from 16 call sites), half free.
func BenchmarkDecodeApply(b *testing.B) {
	const n = 4096
	raws := make([][]byte, 0, 2*n)
	for i := 0; i < n; i++ {
		stack := make([]uint64, 20)
		for j := range stack {
			stack[j] = 0x400000 + uint64(j)*0x40 + uint64(i%16)
		}
		addr := 0x7f0000000000 + uint64(i)*0x100000
		raws = append(raws,
			events.Encode(nil, &events.Event{Time: uint64(2 * i), Duration: 500, PID: 42, TID: 43, Comm: "python3", API: events.CudaMalloc, Addr: addr, Size: 1 << 20, Stack: stack}),
			events.Encode(nil, &events.Event{Time: uint64(2*i + 1), PID: 42, TID: 43, Comm: "python3", API: events.CudaFree, Addr: addr, Flags: events.FlagEntryOnly}))
	}
	l := New()
	var ev events.Event
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := events.Decode(raws[i%len(raws)], &ev); err != nil {
			b.Fatal(err)
		}
		l.Apply(&ev)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
