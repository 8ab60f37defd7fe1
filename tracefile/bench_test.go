package tracefile

import (
	"bytes"
	"io"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// benchRecord is an allocation with a 20-frame stack, as the BPF side
// sends it once trimmed to its frames: 72 + 20*8 bytes.
func benchRecord() []byte {
	ev := events.Event{Time: 1_234_567_890_123, Duration: 4_321, PID: 4242, TID: 4243, Comm: "python3",
		API: events.CudaMalloc, Addr: 0x7f00_0000_0000, Size: 1 << 20}
	for i := range 20 {
		ev.Stack = append(ev.Stack, 0x5555_5555_0000+uint64(i)*0x40)
	}
	return events.Encode(nil, &ev)
}

func BenchmarkWriteEvent(b *testing.B) {
	raw := benchRecord()
	w, err := NewWriter(io.Discard, testMeta())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw) + 9))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := w.WriteEvent(raw); err != nil {
			b.Fatal(err)
		}
		n++
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkReadEvent(b *testing.B) {
	raw := benchRecord()
	const perFile = 10000
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		b.Fatal(err)
	}
	for range perFile {
		w.WriteEvent(raw)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw) + 9))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		rec, err := r.Next()
		if err == io.EOF {
			// Start the file again: one reader setup per 10000 events.
			if r, err = NewReader(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
			rec, err = r.Next()
		}
		if err != nil {
			b.Fatal(err)
		}
		if len(rec.Event.Stack) != 20 {
			b.Fatalf("%d frames", len(rec.Event.Stack))
		}
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}
