package agent

import (
	"runtime"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
)

// BenchmarkAgentEvent is the agent's cost per event (after the ledger's),
// with the flight recorder off and on, over eight processes making
// allocation/free pairs from a few stacks: ns per event, and the heap in
// use after a GC at the end (heap-MiB) beside what the histories account
// for (history-MiB, at most the budget). `make bench` runs it with
// -benchtime 10000000x: ten million events.
func BenchmarkAgentEvent(b *testing.B) {
	for _, c := range []struct {
		name   string
		events int
	}{{"history=off", -1}, {"history=on", DefaultHistoryEvents}} {
		b.Run(c.name, func(b *testing.B) {
			a := New(Options{HistoryEvents: c.events, HistoryBudget: 64 << 20, NoSymbolize: true})
			defer a.Close()
			l := ledger.New()
			const procs = 8
			for pid := uint32(1); pid <= procs; pid++ {
				a.Process(&procmodel.Capture{PID: pid, Comm: "job"})
			}
			stacks := [][]uint64{{0x401000, 0x402000}, {0x401100, 0x402000}, {0x401200, 0x403000}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				pid := uint32(i/2%procs) + 1
				ev := events.Event{Time: uint64(i), PID: pid, Comm: "job", API: events.CudaMalloc,
					Addr: 0x7f0000000000 + uint64(i/2%64)<<20, Size: 1 << 20, Stack: stacks[i/2%len(stacks)]}
				if i%2 == 1 {
					ev = events.Event{Time: uint64(i), PID: pid, Comm: "job", API: events.CudaFree, Addr: ev.Addr}
				}
				a.Event(&ev, l.Apply(&ev))
			}
			b.StopTimer()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
			b.ReportMetric(float64(a.hist.bytes())/(1<<20), "history-MiB")
			runtime.KeepAlive(l)
		})
	}
}
