package record

import (
	"fmt"
	"io"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
)

// BenchmarkApplyPython is what the live views' Python frames cost the
// session per event: for a CPython process, the look-up of each Python
// frame in the process's table (all resolved before: the steady state)
// and the merge into the stack the ledger keeps; beside it the same
// events of a process without Python, applied as they are. Half the
// events allocate (20 native frames, 8 Python frames, from 16 Python
// call sites), half free.
func BenchmarkApplyPython(b *testing.B) {
	const n = 4096
	eval := [][2]uint64{{0x500000, 0x510000}}
	evs := make([]events.Event, 0, 2*n)
	for i := range n {
		stack := make([]uint64, 20)
		for j := range stack {
			stack[j] = 0x400000 + uint64(j)*0x40
		}
		stack[8], stack[12] = 0x500100, 0x500200 // two calls of the interpreter loop
		py := make([]events.PyFrame, 8)
		for j := range py {
			py[j] = events.PyFrame{Code: 0x7f0000 + uint64(j)*0x100, Units: int32(i%16 + j)}
		}
		py[3].Flags, py[7].Flags = events.PyEntry, events.PyEntry
		addr := 0x7f0000000000 + uint64(i)*0x100000
		evs = append(evs,
			events.Event{PID: 42, API: events.CudaMalloc, Addr: addr, Size: 1 << 20, Flags: events.FlagPython, Stack: stack, Py: py},
			events.Event{PID: 42, API: events.CudaFree, Addr: addr, Flags: events.FlagEntryOnly})
	}
	for _, python := range []bool{false, true} {
		b.Run(fmt.Sprintf("python=%v", python), func(b *testing.B) {
			s := newState(Options{}, &Result{Ledger: ledger.New()})
			ps := &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 42})}
			if python {
				ps.py = &pystack.Interp{Eval: eval}
				ps.p.Py = pystack.NewTable(eval)
				for _, ev := range evs {
					for _, f := range ev.Py {
						if !ps.p.Py.Has(f.Code, f.Units) {
							ps.p.Py.Put(pystack.Code{Code: f.Code, Units: f.Units, File: "/app/train.py", Function: "f", Line: 1})
						}
					}
				}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				ev := &evs[i%len(evs)]
				if python {
					s.resolvePython(ev, ps)
				}
				s.apply(ev, ps)
			}
		})
	}
}

// BenchmarkSessionRecord is the reader's work per event past the ring
// buffer (session.Record: decode, the unwind step, the trace write, the
// ledger), for the records `bench/readercpu.sh` traces: an allocation with
// 12 frame-pointer frames and a 16 KiB stack window, then its free. The
// process's capture has no mappings, so the window is dropped unread: the
// unwinder's own cost is BenchmarkUnwind's (package unwind). Half the ops
// allocate, half free; allocs/op is per event.
func BenchmarkSessionRecord(b *testing.B) {
	const n = 512
	var raws [][]byte
	win := make([]byte, 16<<10)
	for i := range n {
		stack := make([]uint64, 12)
		for j := range stack {
			stack[j] = 0x401000 + uint64(j)*0x40 + uint64(i%8)
		}
		addr := 0x7f0000000000 + uint64(i)*0x100000
		raws = append(raws,
			events.Encode(nil, &events.Event{PID: 42, TID: 42, Comm: "loop", API: events.CudaMalloc, Addr: addr, Size: 1 << 20,
				Flags: events.FlagWindow, Stack: stack, Regs: events.Regs{SP: 0x7ffd0000}, Window: win}),
			events.Encode(nil, &events.Event{PID: 42, TID: 42, Comm: "loop", API: events.CudaFree, Addr: addr,
				Flags: events.FlagEntryOnly}))
	}
	benchRecord(b, raws)
}

// BenchmarkSessionRecordPython is session.Record for the records of a
// CPython process recorded with --stack-window 0: an allocation with 20
// frame-pointer frames and 8 Python frames, as BPF lays it out (the Python
// frames right after the frames, then the rest of the room reserved), then
// its free. The trace keeps the record's prefix as it is; before the
// Python frames followed the frames, each such record was re-encoded.
// (The code objects are not resolved: the capture has no interpreter.)
func BenchmarkSessionRecordPython(b *testing.B) {
	const n = 512
	var raws [][]byte
	room := make([]byte, 8*events.MaxFrames+16+16*events.MaxPyFrames) // more than any record leaves unused
	for i := range n {
		stack := make([]uint64, 20)
		for j := range stack {
			stack[j] = 0x401000 + uint64(j)*0x40 + uint64(i%8)
		}
		py := make([]events.PyFrame, 8)
		for j := range py {
			py[j] = events.PyFrame{Code: 0x7f0000 + uint64(j)*0x100, Units: int32(i%16 + j)}
		}
		addr := 0x7f0000000000 + uint64(i)*0x100000
		al := events.Encode(nil, &events.Event{PID: 42, TID: 42, Comm: "python3", API: events.CudaMalloc, Addr: addr, Size: 1 << 20,
			Flags: events.FlagPython | events.FlagPyHead, Stack: stack, Py: py})
		raws = append(raws, append(al, room...),
			events.Encode(nil, &events.Event{PID: 42, TID: 42, Comm: "python3", API: events.CudaFree, Addr: addr,
				Flags: events.FlagEntryOnly}))
	}
	benchRecord(b, raws)
}

// benchRecord hands raws, round and round, to one session that writes a
// trace (to nowhere) for process 42.
func benchRecord(b *testing.B, raws [][]byte) {
	s := newState(Options{}, &Result{Ledger: ledger.New()})
	defer s.close()
	w, err := NewTraceWriter(io.Discard, TraceMeta("bench"))
	if err != nil {
		b.Fatal(err)
	}
	s.w = w
	s.lifeOf(42).rec = &liveProc{p: s.procs.Add(&procmodel.Capture{PID: 42}), exited: true}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		s.Record(raws[i%len(raws)])
	}
	if s.events == 0 || s.res.Ledger.Process(42) == nil {
		b.Fatal("no event reached the ledger")
	}
}
