package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	"github.com/cudatrace/cudatrace/bpf"
)

func TestLayoutMatchesBPF(t *testing.T) {
	var e bpf.CudatraceCtEvent
	var a bpf.CudatraceCtAllocEvent
	var u bpf.CudatraceCtUstack
	var pf bpf.CudatraceCtPyframe
	var pt bpf.CudatraceCtPytrailer
	var pc bpf.CudatraceCtPycode
	var dl bpf.CudatraceCtDlobjs
	var ex bpf.CudatraceCtExecNote
	checks := []struct {
		name      string
		got, want uintptr
	}{
		{"ts_ns", unsafe.Offsetof(e.TsNs), offTime},
		{"dur_ns", unsafe.Offsetof(e.DurNs), offDuration},
		{"addr", unsafe.Offsetof(e.Addr), offAddr},
		{"size", unsafe.Offsetof(e.Size), offSize},
		{"pid", unsafe.Offsetof(e.Pid), offPID},
		{"tid", unsafe.Offsetof(e.Tid), offTID},
		{"device", unsafe.Offsetof(e.Device), offDevice},
		{"result", unsafe.Offsetof(e.Result), offResult},
		{"api", unsafe.Offsetof(e.Api), offAPI},
		{"flags", unsafe.Offsetof(e.Flags), offFlags},
		{"nframes", unsafe.Offsetof(e.Nframes), offNFrames},
		{"comm", unsafe.Offsetof(e.Comm), offComm},
		{"sizeof(ct_event)", unsafe.Sizeof(e), headerSize},
		{"stack", unsafe.Offsetof(a.Stack), headerSize},
		{"frames", uintptr(len(a.Stack)), MaxFrames},
		{"ct_ustack.ip", unsafe.Offsetof(u.Ip), offUIP},
		{"ct_ustack.sp", unsafe.Offsetof(u.Sp), offUSP},
		{"ct_ustack.bp", unsafe.Offsetof(u.Bp), offUBP},
		{"ct_ustack.len", unsafe.Offsetof(u.Len), offULen},
		{"sizeof(ct_ustack)", unsafe.Sizeof(u), ustackSize},
		{"ct_pyframe.units", unsafe.Offsetof(pf.Units), 8},
		{"ct_pyframe.flags", unsafe.Offsetof(pf.Flags), 12},
		{"sizeof(ct_pyframe)", unsafe.Sizeof(pf), pyFrameSize},
		{"sizeof(ct_pytrailer)", unsafe.Sizeof(pt), pyTrailerSize},
		{"ct_pycode.file", unsafe.Offsetof(pc.File), offPyFile},
		{"ct_pycode.name", unsafe.Offsetof(pc.Name), offPyName},
		{"ct_pycode.table", unsafe.Offsetof(pc.Table), offPyTable},
		{"ct_pycode.head_len", unsafe.Offsetof(pc.HeadLen), offPyLens},
		{"ct_pycode.table_len", unsafe.Offsetof(pc.TableLen), offPyLens + 12},
		{"ct_pycode.head", unsafe.Offsetof(pc.Head), offPyHead},
		{"ct_pycode.file_bytes", unsafe.Offsetof(pc.FileBytes), offPyHead + pyHeadSize},
		{"ct_pycode.name_bytes", unsafe.Offsetof(pc.NameBytes), offPyHead + pyHeadSize + pyFileSize},
		{"ct_pycode.table_bytes", unsafe.Offsetof(pc.TableBytes), offPyHead + pyHeadSize + pyFileSize + pyNameSize},
		{"sizeof(ct_pycode)", unsafe.Sizeof(pc), PyCodeRecordLen},
		{"ct_dlobjs.obj", unsafe.Offsetof(dl.Obj), headerSize},
		{"ct_dlobj.addr", unsafe.Offsetof(dl.Obj[0].Addr), 8},
		{"ct_dlobj.name", unsafe.Offsetof(dl.Obj[0].Name), 16},
		{"sizeof(ct_dlobj)", unsafe.Sizeof(dl.Obj[0]), dlObjSize},
		{"CT_DL_BATCH", uintptr(len(dl.Obj)), dlBatch},
		{"sizeof(ct_dlobjs)", unsafe.Sizeof(dl), loadedMaxLen},
		{"ct_exec_note.filename", unsafe.Offsetof(ex.Filename), headerSize},
		{"ct_exec_note.env_len", unsafe.Offsetof(ex.EnvLen), ExecNoteLen},
		{"ct_exec_note.env", unsafe.Offsetof(ex.Env), execEnvAt},
		{"sizeof(ct_exec_note)", unsafe.Sizeof(ex), execEnvAt + execEnvLen},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: BPF has %d, decoder %d", c.name, c.got, c.want)
		}
	}
}

func record(nframes int32, frames ...uint64) []byte {
	b := make([]byte, headerSize+8*len(frames))
	le := binary.LittleEndian
	le.PutUint64(b[offTime:], 1000)
	le.PutUint64(b[offDuration:], 250)
	le.PutUint64(b[offAddr:], 0x7e0000000200)
	le.PutUint64(b[offSize:], 4096)
	le.PutUint32(b[offPID:], 42)
	le.PutUint32(b[offTID:], 43)
	le.PutUint32(b[offDevice:], 1)
	le.PutUint32(b[offResult:], uint32(0xfffffffe)) // -2
	le.PutUint16(b[offAPI:], uint16(CudaMallocPitch))
	le.PutUint16(b[offFlags:], FlagStackTrunc)
	le.PutUint32(b[offNFrames:], uint32(nframes))
	copy(b[offComm:], "python3")
	for i, f := range frames {
		le.PutUint64(b[headerSize+8*i:], f)
	}
	return b
}

func TestDecode(t *testing.T) {
	var ev Event
	if err := Decode(record(2, 0x401000, 0x402000), &ev); err != nil {
		t.Fatal(err)
	}
	want := Event{Time: 1000, Duration: 250, PID: 42, TID: 43, Comm: "python3", API: CudaMallocPitch,
		Addr: 0x7e0000000200, Size: 4096, Device: 1, Result: -2, Flags: FlagStackTrunc}
	if ev.Time != want.Time || ev.Duration != want.Duration || ev.PID != want.PID || ev.TID != want.TID ||
		ev.Comm != want.Comm || ev.API != want.API || ev.Addr != want.Addr || ev.Size != want.Size ||
		ev.Device != want.Device || ev.Result != want.Result || ev.Flags != want.Flags {
		t.Fatalf("got %+v, want %+v", ev, want)
	}
	if len(ev.Stack) != 2 || ev.Stack[0] != 0x401000 || ev.Stack[1] != 0x402000 {
		t.Fatalf("stack %x", ev.Stack)
	}
	if ev.End() != 1250 {
		t.Fatalf("End() = %d, want 1250", ev.End())
	}
}

// cuMemMap's handle travels in the first stack slot, flagged.
func TestDecodeAux(t *testing.T) {
	in := Event{PID: 7, API: CuMemMap, Addr: 0x7000_0000, Size: 2 << 20, Aux: 0xfeed, Flags: FlagAux,
		Stack: []uint64{0x401000, 0x402000}}
	raw := Encode(nil, &in)
	if len(raw) != RecordLen(&in) || len(raw) != headerSize+3*8 {
		t.Fatalf("%d bytes, RecordLen %d", len(raw), RecordLen(&in))
	}
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Aux != 0xfeed || len(ev.Stack) != 2 || ev.Stack[0] != 0x401000 || ev.Stack[1] != 0x402000 {
		t.Fatalf("aux %#x stack %x", ev.Aux, ev.Stack)
	}
	if err := Decode(raw[:headerSize+4], &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("cut aux: %v", err)
	}
	if err := Decode(record(0), &ev); err != nil || ev.Aux != 0 {
		t.Fatalf("a record without the flag kept aux %#x (%v)", ev.Aux, err)
	}
}

func TestDecodeStackError(t *testing.T) {
	var ev Event
	if err := Decode(record(-14), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.StackErr != -14 || len(ev.Stack) != 0 {
		t.Fatalf("StackErr %d, stack %v", ev.StackErr, ev.Stack)
	}
}

func TestDecodeRejectsBadLengths(t *testing.T) {
	var ev Event
	for _, raw := range [][]byte{nil, make([]byte, headerSize-1), record(3, 1, 2), record(MaxFrames + 1)} {
		if err := Decode(raw, &ev); !errors.Is(err, ErrShortRecord) {
			t.Errorf("%d bytes: err %v, want ErrShortRecord", len(raw), err)
		}
	}
}

// A record with a stack window, laid out as the BPF side does (ct_ustack
// after the frames in use, then the bytes), round-trips through Encode, and
// RecordLen keeps exactly the bytes in use of a record reserved larger.
func TestWindowRoundTrip(t *testing.T) {
	win := make([]byte, 5000)
	for i := range win {
		win[i] = byte(i * 7)
	}
	in := Event{Time: 5, PID: 9, TID: 10, Comm: "t", API: CudaMalloc, Flags: FlagWindow,
		Stack: []uint64{0x401000, 0x402000, 0x403000}, Regs: Regs{IP: 0x401000, SP: 0x7ffc0000, BP: 0x7ffc0100}, Window: win}
	raw := Encode(nil, &in)
	if want := headerSize + 3*8 + ustackSize + 5000; len(raw) != want {
		t.Fatalf("encoded %d bytes, want %d", len(raw), want)
	}
	if got := binary.LittleEndian.Uint32(raw[headerSize+3*8+offULen:]); got != 5000 {
		t.Fatalf("len field %d", got)
	}
	reserved := append(raw, make([]byte, 4096)...) // the unused tail of a ring-buffer reservation
	var ev Event
	if err := Decode(reserved, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Regs != in.Regs || string(ev.Window) != string(win) || len(ev.Stack) != 3 || ev.Stack[2] != 0x403000 {
		t.Fatalf("got regs %+v, %d window bytes, stack %x", ev.Regs, len(ev.Window), ev.Stack)
	}
	if RecordLen(&ev) != len(raw) {
		t.Fatalf("RecordLen %d, want %d", RecordLen(&ev), len(raw))
	}
	// The window is the record's bytes, not a copy (the live reader's
	// records are the ring buffer's memory), and capped there: appending
	// to it copies instead of writing into the record.
	if &ev.Window[0] != &reserved[headerSize+3*8+ustackSize] || cap(ev.Window) != len(win) {
		t.Fatalf("Window is not the record's bytes (cap %d)", cap(ev.Window))
	}
	grown := append(ev.Window, 0xaa)
	if reserved[len(raw)] != 0 || &grown[0] == &ev.Window[0] {
		t.Fatal("append to Window wrote into the record")
	}
	// The next record without a window clears it.
	if err := Decode(record(1, 0x401000), &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Window) != 0 || ev.Regs != (Regs{}) {
		t.Fatalf("window %d bytes, regs %+v after a record without one", len(ev.Window), ev.Regs)
	}
	// A length field past the record's end is refused.
	if err := Decode(raw[:len(raw)-1], &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("cut window: err %v", err)
	}
	if err := Decode(raw[:headerSize+3*8+ustackSize-1], &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("cut ct_ustack: err %v", err)
	}
}

// An arm64 record's window carries the link register after struct
// ct_ustack (FlagLR, bpf/arch.h): laid out as BPF writes it, the register
// and the window decode, round-trip through Encode, and RecordLen counts
// the 8 bytes. A record written without its window drops FlagLR with it.
func TestWindowLinkRegister(t *testing.T) {
	win := []byte("0123456789abcdef")
	raw := make([]byte, headerSize+2*8+ustackSize+lrSize+len(win), 4096)
	le := binary.LittleEndian
	le.PutUint16(raw[offFlags:], FlagWindow|FlagEntryOnly|FlagLR)
	le.PutUint32(raw[offNFrames:], 2)
	le.PutUint64(raw[headerSize:], 0xaaaa00001000)
	le.PutUint64(raw[headerSize+8:], 0xaaaa00002000)
	u := raw[headerSize+2*8:]
	le.PutUint64(u[offUIP:], 0xaaaa00001000)
	le.PutUint64(u[offUSP:], 0xffffc0000000)
	le.PutUint64(u[offUBP:], 0xffffc0000100)
	le.PutUint32(u[offULen:], uint32(len(win)))
	le.PutUint64(u[ustackSize:], 0x3d00aaaa00003000) // signed: PAC bits 48-54
	copy(u[ustackSize+lrSize:], win)
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	want := Regs{IP: 0xaaaa00001000, SP: 0xffffc0000000, BP: 0xffffc0000100, LR: 0x3d00aaaa00003000}
	if ev.Regs != want || string(ev.Window) != string(win) {
		t.Fatalf("regs %+v, window %q; want %+v, %q", ev.Regs, ev.Window, want, win)
	}
	if RecordLen(&ev) != len(raw) {
		t.Fatalf("RecordLen %d, want %d", RecordLen(&ev), len(raw))
	}
	if got := Encode(nil, &ev); string(got) != string(raw) {
		t.Fatalf("Encode:\n% x\nwant\n% x", got, raw)
	}
	if err := Decode(raw[:headerSize+2*8+ustackSize+lrSize-1], &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("cut link register: err %v", err)
	}
	// The window unwound and dropped (record's default): no FlagLR left.
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	ev.Flags &^= FlagWindow
	var back Event
	if err := Decode(Encode(nil, &ev), &back); err != nil || back.Flags&FlagLR != 0 || back.Regs != (Regs{}) {
		t.Fatalf("without its window: flags %#x, regs %+v, %v", back.Flags, back.Regs, err)
	}
}

// bpfRecord lays out an allocation record byte by byte as BPF writes it
// (bpf/alloc.h submit_alloc): n frames, a window of w bytes (none when w
// is 0), p Python frames right after them as count, frames (innermost
// last), count; then the rest of the room reserved (MaxFrames frame slots,
// the whole window, MaxPyFrames Python frames), holding garbage from the
// ring's last lap. It returns the record and the event it stands for.
func bpfRecord(n, w, p, window int) ([]byte, Event) {
	le := binary.LittleEndian
	want := Event{Time: 7000, Duration: 30, Addr: 0x7e0000100000, Size: 1 << 20, PID: 71, TID: 72, Comm: "python3",
		API: CudaMalloc, Device: 2}
	b := make([]byte, headerSize+MaxFrames*8+ustackSize+window+8+MaxPyFrames*pyFrameSize+8)
	for i := range b {
		b[i] = byte(0xa0 + i%7)
	}
	le.PutUint64(b[offTime:], want.Time)
	le.PutUint64(b[offDuration:], want.Duration)
	le.PutUint64(b[offAddr:], want.Addr)
	le.PutUint64(b[offSize:], want.Size)
	le.PutUint32(b[offPID:], want.PID)
	le.PutUint32(b[offTID:], want.TID)
	le.PutUint32(b[offDevice:], uint32(want.Device))
	le.PutUint32(b[offResult:], 0)
	le.PutUint16(b[offAPI:], uint16(want.API))
	le.PutUint32(b[offNFrames:], uint32(n))
	copy(b[offComm:offComm+commLen], "python3\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	off := headerSize
	for i := range n {
		want.Stack = append(want.Stack, 0x401000+uint64(i)*0x10)
		le.PutUint64(b[off:], want.Stack[i])
		off += 8
	}
	if w > 0 {
		want.Flags |= FlagWindow
		want.Regs = Regs{IP: 0x401000, SP: 0x7ffd00001000, BP: 0x7ffd00001100}
		le.PutUint64(b[off+offUIP:], want.Regs.IP)
		le.PutUint64(b[off+offUSP:], want.Regs.SP)
		le.PutUint64(b[off+offUBP:], want.Regs.BP)
		le.PutUint32(b[off+offULen:], uint32(w))
		le.PutUint32(b[off+28:], 0)
		off += ustackSize
		for i := range w {
			b[off+i] = byte(i * 13)
		}
		want.Window = b[off : off+w]
		off += w
	}
	if p > 0 {
		want.Flags |= FlagPython | FlagPyHead
		le.PutUint64(b[off:], uint64(p))
		off += 8
		for j := range p { // innermost first in Py, last in the record
			f := PyFrame{Code: 0x7f0000001000 + uint64(j)<<12, Units: int32(10 * j), Flags: uint32(j % 2)}
			want.Py = append(want.Py, f)
			r := b[off+(p-1-j)*pyFrameSize:]
			le.PutUint64(r, f.Code)
			le.PutUint32(r[8:], uint32(f.Units))
			le.PutUint32(r[12:], f.Flags)
		}
		off += p * pyFrameSize
		le.PutUint64(b[off:], uint64(p))
	}
	le.PutUint16(b[offFlags:], want.Flags)
	return b, want
}

func sameEvent(t *testing.T, what string, got, want *Event) {
	t.Helper()
	if got.Time != want.Time || got.Duration != want.Duration || got.Addr != want.Addr || got.Size != want.Size ||
		got.PID != want.PID || got.TID != want.TID || got.Comm != want.Comm || got.API != want.API ||
		got.Device != want.Device || got.Result != want.Result || got.Flags != want.Flags || got.Regs != want.Regs ||
		!slices.Equal(got.Stack, want.Stack) || !bytes.Equal(got.Window, want.Window) || !slices.Equal(got.Py, want.Py) {
		t.Fatalf("%s: got %+v\nwant %+v", what, got, want)
	}
}

// The Python frames follow what the record uses (FlagPyHead): BPF writes
// them right after the frames and window, however much of the room
// reserved those take, and RecordLen's prefix (what a trace keeps) holds
// them; Encode writes exactly that prefix.
func TestPythonAfterFramesAndWindow(t *testing.T) {
	for _, c := range []struct{ n, w, p, window int }{
		{3, 0, 2, 0},
		{12, 16384, 7, 16384},
		{12, 5000, 1, 16384}, // the stack ended inside the window
		{MaxFrames, 16384, MaxPyFrames, 16384},
		{1, 4096, 5, 65536},
	} {
		raw, want := bpfRecord(c.n, c.w, c.p, c.window)
		name := fmt.Sprintf("%d frames, window %d, %d Python frames", c.n, c.w, c.p)
		var ev Event
		if err := Decode(raw, &ev); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		sameEvent(t, name, &ev, &want)
		used := headerSize + 8*c.n + 8 + c.p*pyFrameSize + 8
		if c.w > 0 {
			used += ustackSize + c.w
		}
		if RecordLen(&ev) != used {
			t.Fatalf("%s: RecordLen %d, want %d", name, RecordLen(&ev), used)
		}
		// What a trace keeps decodes the same, and is what Encode writes.
		var cut Event
		if err := Decode(raw[:used], &cut); err != nil {
			t.Fatalf("%s: the prefix: %v", name, err)
		}
		sameEvent(t, name+", the prefix", &cut, &want)
		if enc := Encode(nil, &ev); !bytes.Equal(enc, raw[:used]) {
			t.Fatalf("%s: Encode differs from BPF's record", name)
		}
		// A reader that knows no FlagPyHead finds the frames at the end of
		// the prefix, as in the traces it wrote.
		old := Event{}
		if err := decodePyAtEnd(raw[:used], &old); err != nil || !slices.Equal(old.Py, want.Py) {
			t.Fatalf("%s: read from the end: %+v, %v", name, old.Py, err)
		}
		// Counts that disagree, or one past what the record holds, are refused.
		bad := slices.Clone(raw)
		binary.LittleEndian.PutUint32(bad[used-8:], uint32(c.p+1))
		if err := Decode(bad, &ev); !errors.Is(err, ErrShortRecord) {
			t.Fatalf("%s: counts %d and %d: err %v", name, c.p, c.p+1, err)
		}
		if err := Decode(raw[:used-1], &ev); !errors.Is(err, ErrShortRecord) {
			t.Fatalf("%s: cut by a byte: err %v", name, err)
		}
	}
}

// Traces written before FlagPyHead end each record with its Python frames
// (right after the frames and window there): they still decode, and
// re-encode to the same bytes.
func TestPythonAtEndOfOlderTraces(t *testing.T) {
	py := []PyFrame{{Code: 0x7f0000001000, Units: 12, Flags: 0}, {Code: 0x7f0000002000, Units: 40, Flags: PyEntry}, {Code: 0x7f0000003000, Units: -1, Flags: PyEntry}}
	in := Event{Time: 5, PID: 9, TID: 10, Comm: "t", API: CudaMalloc, Flags: FlagWindow | FlagPython,
		Stack: []uint64{0x401000, 0x402000}, Regs: Regs{IP: 0x401000, SP: 0x7ffc0000, BP: 0x7ffc0100}, Window: []byte{1, 2, 3}, Py: py}
	raw := Encode(nil, &in)
	if want := headerSize + 2*8 + ustackSize + 3 + 3*pyFrameSize + pyTrailerSize; len(raw) != want {
		t.Fatalf("encoded %d bytes, want %d", len(raw), want)
	}
	// The layout itself, byte by byte: innermost frame last, then the count.
	le := binary.LittleEndian
	end := len(raw) - pyTrailerSize
	if le.Uint32(raw[end:]) != 3 || le.Uint64(raw[end-pyFrameSize:]) != py[0].Code || le.Uint64(raw[end-3*pyFrameSize:]) != py[2].Code {
		t.Fatalf("layout: % x", raw[headerSize+2*8+ustackSize+3:])
	}
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	sameEvent(t, "older layout", &ev, &in)
	if RecordLen(&ev) != len(raw) || !bytes.Equal(Encode(nil, &ev), raw) {
		t.Fatalf("RecordLen %d of %d, or re-encoded bytes differ", RecordLen(&ev), len(raw))
	}
	// A count past what the record holds is refused, as is one past the cap.
	binary.LittleEndian.PutUint32(raw[len(raw)-pyTrailerSize:], 9)
	if err := Decode(raw, &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("9 frames in a record of 3: err %v", err)
	}
	binary.LittleEndian.PutUint32(raw[len(raw)-pyTrailerSize:], MaxPyFrames+1)
	if err := Decode(raw, &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("%d frames: err %v", MaxPyFrames+1, err)
	}
	// The next record without Python frames has none.
	if err := Decode(record(1, 0x401000), &ev); err != nil || len(ev.Py) != 0 {
		t.Fatalf("py %+v after a record without, err %v", ev.Py, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(record(2, 1, 2))
	f.Add(record(-1))
	rec, _ := bpfRecord(2, 64, 2, 4096)
	f.Add(rec)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev Event
		if Decode(raw, &ev) == nil && (len(ev.Stack) > MaxFrames || len(ev.Window) > MaxWindow || RecordLen(&ev) > len(raw)) {
			t.Fatalf("%d frames, %d window bytes, RecordLen %d of %d", len(ev.Stack), len(ev.Window), RecordLen(&ev), len(raw))
		}
	})
}

// A capture record decodes to its parts, each cut to the bytes BPF read,
// copied out of the record; a length past its part's room is an error,
// never a panic or a part read from the next.
func TestDecodePyCode(t *testing.T) {
	raw := make([]byte, PyCodeRecordLen)
	le := binary.LittleEndian
	le.PutUint64(raw[offTime:], 77)
	le.PutUint64(raw[offAddr:], 0x7f0000001000)
	le.PutUint64(raw[offSize:], 0xfeedface)
	le.PutUint32(raw[offPID:], 4242)
	le.PutUint16(raw[offAPI:], uint16(PyCode))
	le.PutUint16(raw[offFlags:], FlagEntryOnly)
	le.PutUint64(raw[offPyFile:], 0x5000)
	le.PutUint64(raw[offPyName:], 0x6000)
	le.PutUint64(raw[offPyTable:], 0x7000)
	for i, n := range []uint32{200, 48, 0, 4096} {
		le.PutUint32(raw[offPyLens+4*i:], n)
	}
	raw[offPyHead] = 'h'
	raw[offPyHead+pyHeadSize] = 'f'
	raw[offPyHead+pyHeadSize+pyFileSize+pyNameSize+4095] = 't'
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	var c PyCodeCapture
	if err := DecodePyCode(raw, &ev, &c); err != nil {
		t.Fatal(err)
	}
	if c.PID != 4242 || c.Time != 77 || c.Code != 0x7f0000001000 || c.Ident != 0xfeedface || c.File != 0x5000 ||
		c.Name != 0x6000 || c.Table != 0x7000 || len(c.Head) != 200 || c.Head[0] != 'h' || len(c.FileBytes) != 48 ||
		c.FileBytes[0] != 'f' || len(c.NameBytes) != 0 || len(c.TableBytes) != 4096 || c.TableBytes[4095] != 't' {
		t.Errorf("DecodePyCode = %+v", c)
	}
	raw[offPyHead] = 'x'
	if c.Head[0] != 'h' {
		t.Error("the capture's parts share the record's memory")
	}
	le.PutUint32(raw[offPyLens+4:], pyFileSize+1)
	if err := DecodePyCode(raw, &ev, &c); !errors.Is(err, ErrShortRecord) {
		t.Errorf("a part longer than its room: %v", err)
	}
	if err := DecodePyCode(raw[:PyCodeRecordLen-1], &ev, &c); !errors.Is(err, ErrShortRecord) {
		t.Errorf("a short record: %v", err)
	}
}

// A LibrariesMapped record decodes to its objects, as many as its header
// says, paths cut at their NUL; a count past the record is an error.
func TestDecodeLoaded(t *testing.T) {
	raw := make([]byte, headerSize+2*dlObjSize)
	le := binary.LittleEndian
	le.PutUint16(raw[offAPI:], uint16(LibrariesMapped))
	le.PutUint64(raw[offSize:], 2)
	le.PutUint64(raw[headerSize:], 0x1000)
	le.PutUint64(raw[headerSize+8:], 0x5555000)
	le.PutUint64(raw[headerSize+dlObjSize:], 0x2000)
	le.PutUint64(raw[headerSize+dlObjSize+8:], 0x7f0000000000)
	copy(raw[headerSize+dlObjSize+16:], "/usr/lib/libcudart.so.12\x00junk")
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLoaded(raw, &ev, nil)
	want := []LoadedObject{{0x1000, 0x5555000, ""}, {0x2000, 0x7f0000000000, "/usr/lib/libcudart.so.12"}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("DecodeLoaded = %+v, %v; want %+v", got, err, want)
	}
	le.PutUint64(raw[offSize:], 3)
	ev.Size = 3
	if _, err := DecodeLoaded(raw, &ev, nil); !errors.Is(err, ErrShortRecord) {
		t.Errorf("3 objects in a record of 2: %v", err)
	}
	exec := make([]byte, ExecNoteLen)
	copy(exec[headerSize:], "/usr/bin/python3.11\x00")
	if got := DecodeExec(exec); got != "/usr/bin/python3.11" {
		t.Errorf("DecodeExec = %q", got)
	}
	if got := DecodeExec(exec[:headerSize]); got != "" {
		t.Errorf("DecodeExec of a plain note = %q", got)
	}
	// The environment BPF copied at the exec: whole strings only (the
	// last, cut at CT_EXEC_ENV, left out), and the start time.
	if env, _, _ := DecodeExecEnv(exec); env != nil {
		t.Errorf("DecodeExecEnv of a note without one = %q", env)
	}
	full := make([]byte, execEnvAt+execEnvLen)
	copy(full, exec)
	le.PutUint64(full[offAddr:], 123456789)
	text := "RANK=3\x00WORLD_SIZE=4\x00\x00CUT=xy"
	le.PutUint32(full[ExecNoteLen:], uint32(len(text)))
	copy(full[execEnvAt:], text)
	env, start, whole := DecodeExecEnv(full)
	if !slices.Equal(env, []string{"RANK=3", "WORLD_SIZE=4"}) || start != 123456789 || !whole {
		t.Errorf("DecodeExecEnv = %q, %d, %v", env, start, whole)
	}
	le.PutUint32(full[ExecNoteLen:], execEnvLen)
	if _, _, whole := DecodeExecEnv(full); whole {
		t.Error("DecodeExecEnv of a copy as long as CT_EXEC_ENV: whole")
	}
	le.PutUint32(full[ExecNoteLen:], execEnvLen+1)
	if env, _, _ := DecodeExecEnv(full); env != nil {
		t.Errorf("DecodeExecEnv of a length past CT_EXEC_ENV = %q", env)
	}
}
