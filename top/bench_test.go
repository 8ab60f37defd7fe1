package top

import (
	"fmt"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/record"
)

// benchLedger is one process holding live allocations from 1000 stacks of
// 20 frames, seen through a collector.
func benchLedger(live int) (*Collector, *record.Result) {
	c := NewCollector(time.Second, 5, nil)
	l := ledger.New()
	stacks := make([][]uint64, 1000)
	for i := range stacks {
		for f := range 20 {
			stacks[i] = append(stacks[i], uint64(0x400000+i*64+f))
		}
	}
	for i := range live {
		ev := &events.Event{Time: uint64(i), PID: 1, TID: 1, Comm: "train", API: events.CudaMalloc,
			Addr: uint64(0x7e0000000000 + i*4096), Size: 4096, Device: int32(i % 2), Stack: stacks[i%len(stacks)]}
		c.Event(ev, l.Apply(ev))
	}
	return c, &record.Result{Ledger: l}
}

// BenchmarkRefresh is one snapshot: what a refresh costs the reader
// goroutine, which reads no ring buffer meanwhile.
func BenchmarkRefresh(b *testing.B) {
	for _, live := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) {
			c, res := benchLedger(live)
			b.ResetTimer()
			for b.Loop() {
				c.Flush(res)
			}
		})
	}
}

// BenchmarkApplyPair is an allocation and its free through the ledger and
// the collector: the unit to weigh a refresh against.
func BenchmarkApplyPair(b *testing.B) {
	c, res := benchLedger(100000)
	l := res.Ledger
	stack := []uint64{1, 2, 3}
	alloc := &events.Event{PID: 1, TID: 1, Comm: "train", API: events.CudaMalloc, Addr: 1 << 40, Size: 512, Stack: stack}
	free := &events.Event{PID: 1, TID: 1, Comm: "train", API: events.CudaFree, Addr: 1 << 40, Flags: events.FlagEntryOnly}
	b.ResetTimer()
	for b.Loop() {
		c.Event(alloc, l.Apply(alloc))
		c.Event(free, l.Apply(free))
	}
}
