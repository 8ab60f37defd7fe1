package agent

import (
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
)

// BenchmarkScrape is the reader goroutine's part of one /metrics scrape,
// with and without the copy of each process's top stacks
// (cudatrace_stack_live_bytes) and their naming (addresses only): 100
// processes holding 1000 segments each, from 50 stacks each.
func BenchmarkScrape(b *testing.B) {
	a := New(Options{NoSymbolize: true})
	defer a.Close()
	led := ledger.New()
	for pid := uint32(1); pid <= 100; pid++ {
		a.Process(&procmodel.Capture{PID: pid, Comm: "job"})
		for i := 0; i < 1000; i++ {
			ev := events.Event{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: uint64(0x10000 + i*0x1000),
				Size: uint64(4096 * (1 + i%7)), Device: int32(i % 2), Stack: []uint64{uint64(0x400000 + i%50), 0x500000}}
			a.Event(&ev, led.Apply(&ev))
		}
	}
	a.ledger = led
	b.Run("stats", func(b *testing.B) {
		for b.Loop() {
			a.stats()
		}
	})
	b.Run("stats+topstacks", func(b *testing.B) {
		var n int
		for b.Loop() {
			a.stats()
			top, src := a.topStacks()
			for _, t := range top {
				n += len(stackLabel(src.Frames(t.stack)))
			}
		}
		if n == 0 {
			b.Fatal("no stacks named")
		}
	})
	// What a /debug/pprof/cuda_memory scrape copies on the reader
	// goroutine, for comparison.
	b.Run("profile", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := a.profile(0, a.scraped, &a.lastScrape); err != nil {
				b.Fatal(err)
			}
		}
	})
}
