package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout of struct ct_event in bpf/cudatrace.h. decode_test.go checks these
// offsets against the bpf2go-generated Go twin, so a change to the C struct
// that is not mirrored here fails the tests instead of garbling events.
const (
	offTime     = 0
	offDuration = 8
	offAddr     = 16
	offSize     = 24
	offPID      = 32
	offTID      = 36
	offDevice   = 40
	offResult   = 44
	offAPI      = 48
	offFlags    = 50
	offNFrames  = 52
	offComm     = 56
	commLen     = 16
	headerSize  = 72

	// MaxFrames is CT_MAX_FRAMES: stack slots in an allocation record.
	MaxFrames = 127

	// struct ct_ustack, after the frames in use when FlagWindow is set.
	offUIP     = 0
	offUSP     = 8
	offUBP     = 16
	offULen    = 24
	ustackSize = 32

	// MaxWindow is CT_MAX_WINDOW: the most stack bytes a record carries.
	MaxWindow = 64 << 10

	// MaxPyFrames is CT_PY_MAX_FRAMES. With FlagPython a record ends with
	// n struct ct_pyframe (16 bytes; innermost last) and an 8-byte
	// trailer whose first word is n.
	MaxPyFrames   = 32
	pyFrameSize   = 16
	pyTrailerSize = 8
)

// ErrShortRecord means a ring-buffer record was smaller than its header says.
var ErrShortRecord = errors.New("short record")

// Decode parses one ring-buffer record into ev, reusing ev.Stack's backing
// array when it is large enough. It never panics on malformed input.
func Decode(raw []byte, ev *Event) error {
	if len(raw) < headerSize {
		return fmt.Errorf("decode record of %d bytes: %w", len(raw), ErrShortRecord)
	}
	le := binary.LittleEndian
	ev.Time = le.Uint64(raw[offTime:])
	ev.Duration = le.Uint64(raw[offDuration:])
	ev.Addr = le.Uint64(raw[offAddr:])
	ev.Size = le.Uint64(raw[offSize:])
	ev.PID = le.Uint32(raw[offPID:])
	ev.TID = le.Uint32(raw[offTID:])
	ev.Device = int32(le.Uint32(raw[offDevice:]))
	ev.Result = int32(le.Uint32(raw[offResult:]))
	ev.API = API(le.Uint16(raw[offAPI:]))
	ev.Flags = le.Uint16(raw[offFlags:])
	n := int32(le.Uint32(raw[offNFrames:]))
	comm := raw[offComm : offComm+commLen]
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	if ev.Comm != string(comm) { // most events repeat the last comm: skip the allocation
		ev.Comm = string(comm)
	}
	ev.Stack = ev.Stack[:0]
	ev.StackErr = 0
	ev.Aux = 0
	ev.Regs = Regs{}
	ev.Window = nil
	ev.Py = ev.Py[:0]
	if ev.Flags&FlagPython != 0 {
		if err := decodePy(raw, ev); err != nil {
			return err
		}
	}
	off := headerSize
	if ev.Flags&FlagAux != 0 {
		if len(raw) < off+8 {
			return fmt.Errorf("decode record: no aux value in %d bytes: %w", len(raw), ErrShortRecord)
		}
		ev.Aux = le.Uint64(raw[off:])
		off += 8
	}
	if n < 0 {
		ev.StackErr = n
		return nil
	}
	if int(n) > MaxFrames || off+int(n)*8 > len(raw) {
		return fmt.Errorf("decode record: %d frames in %d bytes: %w", n, len(raw), ErrShortRecord)
	}
	for i := 0; i < int(n); i++ {
		ev.Stack = append(ev.Stack, le.Uint64(raw[off+i*8:]))
	}
	if ev.Flags&FlagWindow == 0 {
		if RecordLen(ev) > len(raw) {
			return fmt.Errorf("decode record: Python frames overlap the stack in %d bytes: %w", len(raw), ErrShortRecord)
		}
		return nil
	}
	u := raw[off+int(n)*8:]
	if len(u) < ustackSize {
		return fmt.Errorf("decode record: stack window header past the end of %d bytes: %w", len(raw), ErrShortRecord)
	}
	ev.Regs = Regs{IP: le.Uint64(u[offUIP:]), SP: le.Uint64(u[offUSP:]), BP: le.Uint64(u[offUBP:])}
	wlen := le.Uint32(u[offULen:])
	if wlen > MaxWindow || int(wlen) > len(u)-ustackSize {
		return fmt.Errorf("decode record: stack window of %d bytes in %d: %w", wlen, len(raw), ErrShortRecord)
	}
	// Not copied: the live reader hands over the ring buffer's memory,
	// and 16 KiB a record was most of decoding's cost. Capped, so that an
	// append copies rather than writes into raw.
	ev.Window = u[ustackSize : ustackSize+int(wlen) : ustackSize+int(wlen)]
	if RecordLen(ev) > len(raw) {
		return fmt.Errorf("decode record: Python frames overlap the stack window in %d bytes: %w", len(raw), ErrShortRecord)
	}
	return nil
}

// decodePy reads the Python frames from the end of raw: the ring buffer's
// records keep them at the end of the room reserved, trace files right
// after the frames and window; both end with them.
func decodePy(raw []byte, ev *Event) error {
	le := binary.LittleEndian
	if len(raw) < headerSize+pyTrailerSize {
		return fmt.Errorf("decode record: no Python trailer in %d bytes: %w", len(raw), ErrShortRecord)
	}
	end := len(raw) - pyTrailerSize
	n := int(le.Uint32(raw[end:]))
	if n > MaxPyFrames || end-n*pyFrameSize < headerSize {
		return fmt.Errorf("decode record: %d Python frames in %d bytes: %w", n, len(raw), ErrShortRecord)
	}
	for j := 0; j < n; j++ {
		f := raw[end-(j+1)*pyFrameSize:]
		ev.Py = append(ev.Py, PyFrame{Code: le.Uint64(f), Units: int32(le.Uint32(f[8:])), Flags: le.Uint32(f[12:])})
	}
	return nil
}

// Encode appends ev in the BPF record layout that Decode reads: tests and
// tools that synthesize traces use it. A StackErr is written in place of
// the frame count, as the BPF side does.
func Encode(dst []byte, ev *Event) []byte {
	n := len(ev.Stack)
	off := headerSize
	if ev.Flags&FlagAux != 0 {
		off += 8
		n = min(n, MaxFrames-1)
	}
	if n > MaxFrames {
		n = MaxFrames
	}
	if ev.StackErr < 0 {
		n = 0
	}
	win := min(len(ev.Window), MaxWindow)
	flags := ev.Flags &^ FlagWindow
	tail := 0
	if ev.Flags&FlagWindow != 0 && ev.StackErr >= 0 {
		flags |= FlagWindow
		tail = ustackSize + win
	}
	py := 0
	flags &^= FlagPython
	if ev.Flags&FlagPython != 0 {
		flags |= FlagPython
		py = min(len(ev.Py), MaxPyFrames)*pyFrameSize + pyTrailerSize
	}
	start := len(dst)
	dst = append(dst, make([]byte, off+n*8+tail+py)...)
	b := dst[start:]
	le := binary.LittleEndian
	le.PutUint64(b[offTime:], ev.Time)
	le.PutUint64(b[offDuration:], ev.Duration)
	le.PutUint64(b[offAddr:], ev.Addr)
	le.PutUint64(b[offSize:], ev.Size)
	le.PutUint32(b[offPID:], ev.PID)
	le.PutUint32(b[offTID:], ev.TID)
	le.PutUint32(b[offDevice:], uint32(ev.Device))
	le.PutUint32(b[offResult:], uint32(ev.Result))
	le.PutUint16(b[offAPI:], uint16(ev.API))
	le.PutUint16(b[offFlags:], flags)
	nf := int32(n)
	if ev.StackErr < 0 {
		nf = ev.StackErr
	}
	le.PutUint32(b[offNFrames:], uint32(nf))
	copy(b[offComm:offComm+commLen-1], ev.Comm) // keep a NUL terminator, as the kernel does
	if off > headerSize {
		le.PutUint64(b[headerSize:], ev.Aux)
	}
	for i := 0; i < n; i++ {
		le.PutUint64(b[off+i*8:], ev.Stack[i])
	}
	if tail > 0 {
		u := b[off+n*8:]
		le.PutUint64(u[offUIP:], ev.Regs.IP)
		le.PutUint64(u[offUSP:], ev.Regs.SP)
		le.PutUint64(u[offUBP:], ev.Regs.BP)
		le.PutUint32(u[offULen:], uint32(win))
		copy(u[ustackSize:], ev.Window[:win])
	}
	if py > 0 {
		p := b[off+n*8+tail:]
		np := (py - pyTrailerSize) / pyFrameSize
		for j := 0; j < np; j++ {
			f := p[(np-1-j)*pyFrameSize:]
			le.PutUint64(f, ev.Py[j].Code)
			le.PutUint32(f[8:], uint32(ev.Py[j].Units))
			le.PutUint32(f[12:], ev.Py[j].Flags)
		}
		le.PutUint32(p[np*pyFrameSize:], uint32(np))
	}
	return dst[:start+off+n*8+tail+py]
}

// RecordLen is how many bytes of a raw record Decode used for ev: the BPF
// side reserves room for MaxFrames frames and the whole stack window in
// every allocation record, and writers keep only this prefix. A record
// with FlagPython keeps its Python frames at the end instead: re-encode it
// (Encode) rather than cut it.
func RecordLen(ev *Event) int {
	n := headerSize + 8*len(ev.Stack)
	if ev.Flags&FlagAux != 0 {
		n += 8
	}
	if ev.Flags&FlagWindow != 0 {
		n += ustackSize + len(ev.Window)
	}
	if ev.Flags&FlagPython != 0 {
		n += len(ev.Py)*pyFrameSize + pyTrailerSize
	}
	return n
}
