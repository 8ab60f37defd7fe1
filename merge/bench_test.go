package merge_test

import (
	"io"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// benchNode is one node's trace of events allocations and frees with
// 20-frame stacks, by two processes whose PIDs the other node's share.
func benchNode(b *testing.B, host string, wall time.Time, boot uint64, n int) string {
	items := []any{&tracefile.Process{PID: 100, Comm: "python3", Time: boot}, &tracefile.Process{PID: 101, Comm: "python3", Time: boot}}
	stack := make([]uint64, 20)
	for i := range stack {
		stack[i] = 0x5555_5555_0000 + uint64(i)*0x40
	}
	for i := range n {
		pid := uint32(100 + i%2)
		ev := events.Event{Time: boot + uint64(i)*1000, Duration: 10, PID: pid, TID: pid, Comm: "python3",
			API: events.CudaMalloc, Addr: 0x7000_0000 + uint64(i/2%64)<<20, Size: 1 << 20, Stack: stack}
		if i/128%2 == 1 {
			ev.API, ev.Duration, ev.Flags, ev.Stack = events.CudaFree, 0, events.FlagEntryOnly, nil
		}
		items = append(items, ev)
	}
	items = append(items, &tracefile.End{Time: boot + uint64(n)*1000})
	path, _ := tracetest.Write(b, tracefile.Meta{Tool: "b", Host: host, StartWall: wall, StartBoot: boot}, items...)
	return path
}

// BenchmarkMerge merges two nodes' traces; BenchmarkReplayBoth replays
// the same two traces, what a report of them costs at the least: the
// ratio says what the merge adds to reading a job.
func BenchmarkMerge(b *testing.B) {
	a, c := benchInputs(b)
	for b.Loop() {
		if _, err := merge.Write(io.Discard, []merge.Input{{Path: a}, {Path: c}}, "b"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*2*benchEvents)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkReplayBoth(b *testing.B) {
	a, c := benchInputs(b)
	for b.Loop() {
		for _, p := range []string{a, c} {
			if _, err := replay.Read(p, replay.Options{FramePointersOnly: true}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N*2*benchEvents)/b.Elapsed().Seconds(), "events/s")
}

const benchEvents = 100_000

func benchInputs(b *testing.B) (string, string) {
	wall := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	return benchNode(b, "node-a", wall, 1e12, benchEvents), benchNode(b, "node-b", wall.Add(time.Second), 5e12, benchEvents)
}
