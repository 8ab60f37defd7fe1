// Package tracetest writes trace files for tests: a sequence of events and
// frames, as the recorder would have written them.
package tracetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Write writes items (events.Event and the tracefile frame types, by
// pointer) to a new trace file in a temporary directory. It returns the
// path and the file's size after each item, for tests that cut it short.
func Write(t testing.TB, meta tracefile.Meta, items ...any) (string, []int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.trace")
	w, err := tracefile.Create(path, meta)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for _, it := range items {
		switch v := it.(type) {
		case events.Event:
			err = w.WriteEvent(events.Encode(nil, &v))
		case *tracefile.Process:
			err = w.WriteProcess(v)
		case *tracefile.Attach:
			err = w.WriteAttach(v)
		case *tracefile.Counters:
			err = w.WriteCounters(v)
		case *tracefile.End:
			err = w.WriteEnd(v)
		case *tracefile.NVML:
			err = w.WriteNVML(v)
		case *tracefile.Symbols:
			err = w.WriteSymbols(v)
		case *tracefile.Python:
			err = w.WritePython(v)
		default:
			t.Fatalf("tracetest.Write: %T", it)
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, st.Size())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path, ends
}

// Big describes a synthetic trace of one process for size and speed
// checks: Events events (allocations and their frees, about half each)
// from Stacks stacks of Depth frames on two devices, each allocation freed
// Window allocations later, so about Window allocations are live at any
// time. Every LeakEvery-th allocation (0: none) comes from a stack of its
// own and is never freed; one allocation of 1 TiB fails with
// cudaErrorMemoryAllocation in the middle. Events are StepNS apart.
type Big struct {
	Events, Stacks, Depth, Window, LeakEvery int
	StepNS                                   uint64
}

// Big's fixed facts, for assertions.
const (
	BigPID       = 4242
	BigStart     = 1_000_000   // the recording's start, boot ns
	BigLeakFrame = 0x7e57_0000 // the leak stack's innermost frame
	BigSize      = 1 << 20     // bytes of each allocation but the leaks'
	BigLeakSize  = 3 << 20     // bytes of each leak
	BigFailSize  = 1 << 40     // the failed allocation's size
)

// WriteBig writes the trace b describes to path, fast: no flush per
// event. It returns the number of leaks written.
func WriteBig(t testing.TB, path string, b Big) int {
	t.Helper()
	w, err := tracefile.Create(path, tracefile.Meta{Tool: "tracetest", StartBoot: BigStart, Host: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteProcess(&tracefile.Process{PID: BigPID, Comm: "big", Time: BigStart}); err != nil {
		t.Fatal(err)
	}
	stack := make([]uint64, b.Depth)
	var buf []byte
	tm := uint64(BigStart)
	write := func(ev *events.Event) {
		tm += b.StepNS
		ev.Time, ev.PID, ev.TID, ev.Comm = tm, BigPID, BigPID, "big"
		buf = events.Encode(buf[:0], ev)
		if err := w.WriteEvent(buf); err != nil {
			t.Fatal(err)
		}
	}
	allocs := b.Events / 2
	leaks := 0
	addr := func(i int) uint64 { return 0x7000_0000_0000 + uint64(i)*0x10_0000 }
	for i := 0; i < allocs+b.Window; i++ {
		if i < allocs {
			ev := events.Event{API: events.CudaMalloc, Addr: addr(i), Size: BigSize, Device: int32(i % 2), Duration: 1}
			for j := range stack {
				stack[j] = 0x40_0000 + uint64(i%b.Stacks)*0x1000 + uint64(j)*8
			}
			if b.LeakEvery > 0 && i%b.LeakEvery == b.LeakEvery-1 {
				stack[0] = BigLeakFrame
				ev.Size = BigLeakSize
				leaks++
			}
			ev.Stack = stack
			write(&ev)
			if i == allocs/2 {
				write(&events.Event{API: events.CudaMalloc, Size: BigFailSize, Device: 0, Result: 2, Duration: 1, Stack: stack})
			}
		}
		if j := i - b.Window; j >= 0 && !(b.LeakEvery > 0 && j%b.LeakEvery == b.LeakEvery-1) {
			write(&events.Event{API: events.CudaFree, Addr: addr(j), Device: int32(j % 2), Flags: events.FlagEntryOnly})
		}
	}
	if err := w.WriteEnd(&tracefile.End{Time: tm + b.StepNS}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return leaks
}
