package unwind

import (
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// BenchmarkUnwind is the per-event cost of unwinding the test chain's
// 8 frames (three files) from a copied window once the files' rows are
// cached: what recording or replaying a trace pays for each allocation
// record whose stack repeats, as most do (the memo answers it).
func BenchmarkUnwind(b *testing.B) {
	d := runDump(b, chain(b, b.TempDir()))
	u := New()
	defer u.Close()
	maps := NewMaps(d.maps)
	var pcs []uint64
	pcs, stop := u.Unwind(maps, d.regs, d.window, false, pcs[:0])
	if stop.Kind != StopEnd || len(pcs) < 5 {
		b.Fatalf("%d frames, stop %q", len(pcs), stop)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		pcs, _ = u.Unwind(maps, d.regs, d.window, false, pcs[:0])
	}
	b.ReportMetric(float64(len(pcs)), "frames")
}

// BenchmarkUnwindMiss is the same unwind where the memo does not answer
// (its slot emptied each time): the unwind, its reads noted and kept.
func BenchmarkUnwindMiss(b *testing.B) {
	d := runDump(b, chain(b, b.TempDir()))
	u := New()
	defer u.Close()
	maps := NewMaps(d.maps)
	var pcs []uint64
	pcs, _ = u.Unwind(maps, d.regs, d.window, false, pcs[:0])
	e := maps.memoFor(d.regs)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		e.set = false
		pcs, _ = u.Unwind(maps, d.regs, d.window, false, pcs[:0])
	}
	if maps.memoHits != 0 {
		b.Fatalf("%d answered by the memo", maps.memoHits)
	}
	b.ReportMetric(float64(len(pcs)), "frames")
}

// BenchmarkUnwindCold is the first unwind through files never seen: open
// each, find its FDEs through .eh_frame_hdr, run their CFA programs.
func BenchmarkUnwindCold(b *testing.B) {
	d := runDump(b, chain(b, b.TempDir()))
	b.ReportAllocs()
	for b.Loop() {
		u := New()
		u.Unwind(NewMaps(d.maps), d.regs, d.window, false, nil)
		u.Close()
	}
}

// BenchmarkDecodeWindow is decoding an allocation record carrying a 16 KiB
// window (the copy into the event included), beside events'
// BenchmarkDecodeApply for records without one.
func BenchmarkDecodeWindow(b *testing.B) {
	in := events.Event{PID: 1, TID: 1, API: events.CudaMalloc, Flags: events.FlagWindow,
		Stack: make([]uint64, 20), Window: make([]byte, 16<<10)}
	raw := events.Encode(nil, &in)
	var ev events.Event
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	for b.Loop() {
		if err := events.Decode(raw, &ev); err != nil {
			b.Fatal(err)
		}
	}
}
