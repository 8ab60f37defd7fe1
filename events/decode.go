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
	// With FlagLR (arm64) the link register follows struct ct_ustack,
	// before the window's bytes.
	lrSize = 8

	// MaxWindow is CT_MAX_WINDOW: the most stack bytes a record carries.
	MaxWindow = 64 << 10

	// MaxPyFrames is CT_PY_MAX_FRAMES. With FlagPython a record has n
	// struct ct_pyframe (16 bytes; innermost last) and an 8-byte count
	// whose first word is n after them; with FlagPyHead the count before
	// them too, right after the frames and window. Without FlagPyHead
	// (older traces) they end the record.
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
	if ev.Flags&(FlagPython|FlagPyHead) == FlagPython {
		if err := decodePyAtEnd(raw, ev); err != nil {
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
		return decodePy(raw, off, ev)
	}
	if int(n) > MaxFrames || off+int(n)*8 > len(raw) {
		return fmt.Errorf("decode record: %d frames in %d bytes: %w", n, len(raw), ErrShortRecord)
	}
	for i := 0; i < int(n); i++ {
		ev.Stack = append(ev.Stack, le.Uint64(raw[off+i*8:]))
	}
	off += int(n) * 8
	if ev.Flags&FlagWindow != 0 {
		u := raw[off:]
		if len(u) < ustackSize {
			return fmt.Errorf("decode record: stack window header past the end of %d bytes: %w", len(raw), ErrShortRecord)
		}
		ev.Regs = Regs{IP: le.Uint64(u[offUIP:]), SP: le.Uint64(u[offUSP:]), BP: le.Uint64(u[offUBP:])}
		wlen := le.Uint32(u[offULen:])
		regs := ustackSize
		if ev.Flags&FlagLR != 0 {
			if len(u) < ustackSize+lrSize {
				return fmt.Errorf("decode record: link register past the end of %d bytes: %w", len(raw), ErrShortRecord)
			}
			ev.Regs.LR = le.Uint64(u[ustackSize:])
			regs += lrSize
		}
		if wlen > MaxWindow || int(wlen) > len(u)-regs {
			return fmt.Errorf("decode record: stack window of %d bytes in %d: %w", wlen, len(raw), ErrShortRecord)
		}
		// Not copied: the live reader hands over the ring buffer's memory,
		// and 16 KiB a record was most of decoding's cost. Capped, so that an
		// append copies rather than writes into raw.
		ev.Window = u[regs : regs+int(wlen) : regs+int(wlen)]
		off += regs + int(wlen)
	}
	return decodePy(raw, off, ev)
}

// decodePy reads the Python frames of a FlagPyHead record from off, right
// after its frames and window; the ring buffer's records have more room
// reserved after them. Of a record with them at the end (decodePyAtEnd,
// already read) it checks that they do not overlap what comes before.
func decodePy(raw []byte, off int, ev *Event) error {
	if ev.Flags&FlagPython == 0 {
		return nil
	}
	if ev.Flags&FlagPyHead == 0 {
		if RecordLen(ev) > len(raw) {
			return fmt.Errorf("decode record: Python frames overlap the stack in %d bytes: %w", len(raw), ErrShortRecord)
		}
		return nil
	}
	le := binary.LittleEndian
	if len(raw)-off < 2*pyTrailerSize {
		return fmt.Errorf("decode record: no Python frames' count in %d bytes: %w", len(raw), ErrShortRecord)
	}
	n := int(le.Uint32(raw[off:]))
	off += pyTrailerSize
	if n > MaxPyFrames || off+n*pyFrameSize+pyTrailerSize > len(raw) {
		return fmt.Errorf("decode record: %d Python frames in %d bytes: %w", n, len(raw), ErrShortRecord)
	}
	if m := int(le.Uint32(raw[off+n*pyFrameSize:])); m != n {
		return fmt.Errorf("decode record: %d Python frames, then a count of %d: %w", n, m, ErrShortRecord)
	}
	for j := n - 1; j >= 0; j-- { // innermost last
		f := raw[off+j*pyFrameSize:]
		ev.Py = append(ev.Py, PyFrame{Code: le.Uint64(f), Units: int32(le.Uint32(f[8:])), Flags: le.Uint32(f[12:])})
	}
	return nil
}

// decodePyAtEnd reads the Python frames of a record without FlagPyHead
// from the end of raw: trace files written before it keep them right after
// the frames and window, and end with them.
func decodePyAtEnd(raw []byte, ev *Event) error {
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
	flags := ev.Flags &^ (FlagWindow | FlagLR)
	tail, regs := 0, 0
	if ev.Flags&FlagWindow != 0 && ev.StackErr >= 0 {
		flags |= ev.Flags & (FlagWindow | FlagLR)
		regs = ustackSize
		if ev.Flags&FlagLR != 0 {
			regs += lrSize
		}
		tail = regs + win
	}
	py, np, head := 0, 0, 0
	flags &^= FlagPython | FlagPyHead
	if ev.Flags&FlagPython != 0 {
		flags |= ev.Flags & (FlagPython | FlagPyHead)
		np = min(len(ev.Py), MaxPyFrames)
		if ev.Flags&FlagPyHead != 0 {
			head = pyTrailerSize
		}
		py = head + np*pyFrameSize + pyTrailerSize
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
		if regs > ustackSize {
			le.PutUint64(u[ustackSize:], ev.Regs.LR)
		}
		copy(u[regs:], ev.Window[:win])
	}
	if py > 0 {
		p := b[off+n*8+tail:]
		if head > 0 {
			le.PutUint32(p, uint32(np))
			p = p[head:]
		}
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
// side reserves room for MaxFrames frames, the whole stack window and
// MaxPyFrames Python frames in every allocation record, and writers keep
// only this prefix. A record with FlagPython but not FlagPyHead (not one
// BPF writes) keeps its Python frames at the end instead: re-encode it
// (Encode) rather than cut it, unless it is no longer than this.
func RecordLen(ev *Event) int {
	n := headerSize + 8*len(ev.Stack)
	if ev.Flags&FlagAux != 0 {
		n += 8
	}
	if ev.Flags&FlagWindow != 0 {
		n += ustackSize + len(ev.Window)
		if ev.Flags&FlagLR != 0 {
			n += lrSize
		}
	}
	if ev.Flags&FlagPython != 0 {
		n += len(ev.Py)*pyFrameSize + pyTrailerSize
		if ev.Flags&FlagPyHead != 0 {
			n += pyTrailerSize
		}
	}
	return n
}
