package events

import (
	"encoding/binary"
	"errors"
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

// Python frames end the record: in the ring buffer at the end of the room
// reserved, after unused frame slots and window bytes, and in a trace file
// right after the window. Both decode to the same frames, innermost first.
func TestPythonRoundTrip(t *testing.T) {
	py := []PyFrame{{Code: 0x7f0000001000, Units: 12, Flags: 0}, {Code: 0x7f0000002000, Units: 40, Flags: PyEntry}, {Code: 0x7f0000003000, Units: -1, Flags: PyEntry}}
	in := Event{Time: 5, PID: 9, TID: 10, Comm: "t", API: CudaMalloc, Flags: FlagWindow | FlagPython,
		Stack: []uint64{0x401000, 0x402000}, Regs: Regs{IP: 0x401000, SP: 0x7ffc0000, BP: 0x7ffc0100}, Window: []byte{1, 2, 3}, Py: py}
	raw := Encode(nil, &in)
	if want := headerSize + 2*8 + ustackSize + 3 + 3*pyFrameSize + pyTrailerSize; len(raw) != want {
		t.Fatalf("encoded %d bytes, want %d", len(raw), want)
	}
	var ev Event
	if err := Decode(raw, &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Py) != 3 || ev.Py[0] != py[0] || ev.Py[1] != py[1] || ev.Py[2] != py[2] || string(ev.Window) != "\x01\x02\x03" {
		t.Fatalf("got %+v, window %x", ev.Py, ev.Window)
	}
	if RecordLen(&ev) != len(raw) {
		t.Fatalf("RecordLen %d, want %d", RecordLen(&ev), len(raw))
	}
	// As BPF reserves it: the frames block moved to the end, the gap unused.
	tail := 3*pyFrameSize + pyTrailerSize
	body := raw[:len(raw)-tail]
	reserved := append(append(append([]byte{}, body...), make([]byte, 4096)...), raw[len(raw)-tail:]...)
	if err := Decode(reserved, &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Py) != 3 || ev.Py[2] != py[2] || len(ev.Stack) != 2 {
		t.Fatalf("reserved: got %+v, stack %x", ev.Py, ev.Stack)
	}
	// A count past what the record holds is refused, as is one past the cap.
	binary.LittleEndian.PutUint32(raw[len(raw)-pyTrailerSize:], 9)
	if err := Decode(raw, &ev); !errors.Is(err, ErrShortRecord) {
		t.Fatalf("9 frames in a record of 3: err %v", err)
	}
	binary.LittleEndian.PutUint32(reserved[len(reserved)-pyTrailerSize:], MaxPyFrames+1)
	if err := Decode(reserved, &ev); !errors.Is(err, ErrShortRecord) {
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
	f.Fuzz(func(t *testing.T, raw []byte) {
		var ev Event
		if Decode(raw, &ev) == nil && (len(ev.Stack) > MaxFrames || len(ev.Window) > MaxWindow || RecordLen(&ev) > len(raw)) {
			t.Fatalf("%d frames, %d window bytes, RecordLen %d of %d", len(ev.Stack), len(ev.Window), RecordLen(&ev), len(raw))
		}
	})
}
