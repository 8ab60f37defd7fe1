package export

import (
	"io"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/tracefile"
)

// writeBigTrace writes a trace of n events of one process: allocations
// from 1000 stacks of 20 frames on two devices, each freed 1000 events
// later, so about 1000 allocations are live at any time.
func writeBigTrace(b *testing.B, n int) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "big.trace")
	w, err := tracefile.Create(path, tracefile.Meta{Tool: "bench", StartBoot: 1})
	if err != nil {
		b.Fatal(err)
	}
	stack := make([]uint64, 20)
	var buf []byte
	const window = 500 // allocations live at once
	for i := 0; i < n/2+window; i++ {
		if i < n/2 {
			for j := range stack {
				stack[j] = 0x400000 + uint64(i%1000)*0x100 + uint64(j)
			}
			buf = events.Encode(buf[:0], &events.Event{Time: uint64(2 * i), Duration: 1, PID: 42, TID: 42,
				Comm: "train", API: events.CudaMalloc, Addr: 0x7000_0000 + uint64(i)*0x1000, Size: 1 << 20,
				Device: int32(i % 2), Stack: stack})
			if err := w.WriteEvent(buf); err != nil {
				b.Fatal(err)
			}
		}
		if j := i - window; j >= 0 {
			buf = events.Encode(buf[:0], &events.Event{Time: uint64(2*i + 1), PID: 42, TID: 42, Comm: "train",
				API: events.CudaFree, Addr: 0x7000_0000 + uint64(j)*0x1000, Device: int32(j % 2),
				Flags: events.FlagEntryOnly})
			if err := w.WriteEvent(buf); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := w.WriteEnd(&tracefile.End{Time: uint64(n + 2*window + 2)}); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// peakHeap samples the Go heap while f runs and returns the highest
// HeapInuse seen: the evidence that an export's memory does not grow with
// the trace.
func peakHeap(f func()) uint64 {
	var peak uint64
	var mu sync.Mutex
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			mu.Lock()
			peak = max(peak, ms.HeapInuse)
			mu.Unlock()
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	f()
	close(done)
	wg.Wait()
	return peak
}

// BenchmarkExport1M exports a trace of 1M events in every format, without
// symbolization (the frames are not in any file): the cost of replaying
// and writing. Reported: events per second and the peak Go heap.
func BenchmarkExport1M(b *testing.B) {
	const n = 1_000_000
	path := writeBigTrace(b, n)
	for _, f := range Formats() {
		b.Run(string(f), func(b *testing.B) {
			var heap uint64
			for b.Loop() {
				runtime.GC()
				heap = max(heap, peakHeap(func() {
					if err := Write(io.Discard, path, f, Options{NoSymbolize: true}); err != nil {
						b.Fatal(err)
					}
				}))
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MiB")
		})
	}
}
