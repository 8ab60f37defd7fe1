package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Pointer encodings (DW_EH_PE_*) of .eh_frame and .eh_frame_hdr.
const (
	peAbsptr  = 0x00
	peULEB128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x04
	peSLEB128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c
	pePCRel   = 0x10
	peDataRel = 0x30
	peIndir   = 0x80
	peOmit    = 0xff
)

var errBad = errors.New("malformed call-frame information")

// buf reads DWARF's primitive encodings from a byte slice, remembering the
// first error so callers check once.
type buf struct {
	b   []byte
	off int
	err error
}

func (r *buf) fail() {
	if r.err == nil {
		r.err = errBad
	}
	r.off = len(r.b)
}

func (r *buf) u8() uint8 {
	if r.off >= len(r.b) {
		r.fail()
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *buf) bytes(n int) []byte {
	if n < 0 || n > len(r.b)-r.off {
		r.fail()
		return nil
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v
}

func (r *buf) u16() uint16 {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (r *buf) u32() uint32 {
	b := r.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *buf) u64() uint64 {
	b := r.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

func (r *buf) uleb() uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		c := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		if c&0x80 == 0 {
			return v
		}
	}
}

func (r *buf) sleb() int64 {
	var v int64
	shift := uint(0)
	for {
		c := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= int64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
}

// ptr reads a pointer encoded as enc. pc is the virtual address the read
// starts at (for pcrel), data the base of datarel.
func (r *buf) ptr(enc uint8, pc, data uint64) uint64 {
	if enc == peOmit {
		return 0
	}
	var v uint64
	switch enc & 0x0f {
	case peAbsptr, peUdata8, peSdata8:
		v = r.u64()
	case peULEB128:
		v = r.uleb()
	case peUdata2:
		v = uint64(r.u16())
	case peSdata2:
		v = uint64(int64(int16(r.u16())))
	case peUdata4:
		v = uint64(r.u32())
	case peSdata4:
		v = uint64(int64(int32(r.u32())))
	case peSLEB128:
		v = uint64(r.sleb())
	default:
		r.fail()
		return 0
	}
	switch enc & 0x70 {
	case 0:
	case pePCRel:
		v += pc
	case peDataRel:
		v += data
	default:
		r.fail() // textrel, funcrel, aligned: not emitted for x86-64 or arm64 user code
	}
	// peIndir would need the loaded image; FDE addresses never use it.
	if enc&peIndir != 0 {
		r.fail()
	}
	return v
}

// cie is a parsed Common Information Entry.
type cie struct {
	arch      *arch // the file's: which registers the rows follow
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    uint8 // pointer encoding of the FDEs' addresses
	hasAug    bool  // 'z': FDEs carry augmentation data to skip
	signal    bool  // 'S': the FDEs describe signal frames
	initial   []byte
	version   uint8
}

// fde is a parsed Frame Description Entry.
type fde struct {
	cie          *cie
	begin, end   uint64 // file virtual addresses it covers
	instructions []byte
}

// section is a .eh_frame or .debug_frame read on demand: libraries such as
// libtorch_cuda carry tens of MB of it, and a trace needs a few entries.
type section struct {
	r     io.ReaderAt
	size  uint64
	addr  uint64 // virtual address (for pcrel)
	debug bool   // .debug_frame: other CIE ids, absolute addresses
	arch  *arch
}

const maxEntry = 1 << 20 // an FDE or CIE longer than this is taken as garbage

// entry reads the CIE or FDE at off: its body after the length (the id
// field first), the body's offset, and the next entry's offset.
func (s *section) entry(off uint64) (body []byte, bodyOff, next uint64, err error) {
	var lb [12]byte
	n, _ := s.r.ReadAt(lb[:4], int64(off))
	if n < 4 {
		return nil, 0, 0, io.ErrUnexpectedEOF
	}
	length := uint64(binary.LittleEndian.Uint32(lb[:4]))
	bodyOff = off + 4
	if length == 0xffffffff {
		if n, _ := s.r.ReadAt(lb[4:12], int64(off+4)); n < 8 {
			return nil, 0, 0, io.ErrUnexpectedEOF
		}
		length = binary.LittleEndian.Uint64(lb[4:12])
		bodyOff = off + 12
	}
	if length == 0 {
		return nil, bodyOff, bodyOff, nil // a terminator
	}
	if length > maxEntry || bodyOff+length > s.size {
		return nil, 0, 0, fmt.Errorf("entry at %#x of %d bytes: %w", off, length, errBad)
	}
	body = make([]byte, length)
	if n, _ := s.r.ReadAt(body, int64(bodyOff)); uint64(n) < length {
		return nil, 0, 0, io.ErrUnexpectedEOF
	}
	return body, bodyOff, bodyOff + length, nil
}

// isCIE tells a CIE from an FDE by the id field, and for an FDE gives its
// CIE's offset in the section.
func (s *section) isCIE(body []byte, bodyOff uint64) (bool, uint64) {
	if len(body) < 4 {
		return false, 0
	}
	id := binary.LittleEndian.Uint32(body)
	if s.debug {
		if id == 0xffffffff {
			return true, 0
		}
		return false, uint64(id)
	}
	if id == 0 {
		return true, 0
	}
	return false, bodyOff - uint64(id) // relative to the id field itself
}

func (s *section) parseCIE(body []byte) (*cie, error) {
	r := &buf{b: body, off: 4}
	c := &cie{arch: s.arch, version: r.u8(), fdeEnc: peAbsptr}
	aug := r.off
	for r.u8() != 0 && r.err == nil {
	}
	augStr := string(body[aug : r.off-1])
	if len(augStr) >= 2 && augStr[:2] == "eh" {
		r.u64()
		augStr = augStr[2:]
	}
	if c.version >= 4 {
		r.u8() // address size
		r.u8() // segment selector size
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if c.version == 1 {
		c.raReg = uint64(r.u8())
	} else {
		c.raReg = r.uleb()
	}
	if s.debug {
		c.fdeEnc = peUdata8
	}
	if len(augStr) > 0 && augStr[0] == 'z' {
		c.hasAug = true
		n := r.uleb()
		end := r.off + int(n)
		for _, ch := range augStr[1:] {
			switch ch {
			case 'L':
				r.u8()
			case 'P':
				enc := r.u8()
				r.ptr(enc&^peIndir, 0, 0) // personality routine: skipped
			case 'R':
				c.fdeEnc = r.u8()
			case 'S':
				c.signal = true
			}
		}
		if end < r.off || end > len(body) {
			return nil, fmt.Errorf("CIE augmentation %q: %w", augStr, errBad)
		}
		r.off = end
	} else if augStr != "" {
		return nil, fmt.Errorf("CIE augmentation %q not understood", augStr)
	}
	if r.err != nil {
		return nil, r.err
	}
	c.initial = body[r.off:]
	return c, nil
}

// parseFDE reads an FDE's range and instructions, given its CIE.
func (s *section) parseFDE(body []byte, bodyOff uint64, c *cie) (*fde, error) {
	r := &buf{b: body, off: 4}
	pc := s.addr + bodyOff + uint64(r.off)
	begin := r.ptr(c.fdeEnc, pc, 0)
	size := r.ptr(c.fdeEnc&0x0f, 0, 0)
	if c.hasAug {
		n := r.uleb()
		r.bytes(int(n))
	}
	if r.err != nil {
		return nil, r.err
	}
	return &fde{cie: c, begin: begin, end: begin + size, instructions: body[r.off:]}, nil
}

// Register rules (DWARF 6.4.1).
type ruleKind uint8

const (
	ruleSame ruleKind = iota // unspecified: callee-saved registers keep their value
	ruleUndef
	ruleOffset    // saved at CFA+off
	ruleValOffset // is CFA+off
	ruleRegister  // is in register reg
	ruleExpr      // saved at the address expr computes
	ruleValExpr   // is the value expr computes
)

type rule struct {
	kind ruleKind
	off  int64
	reg  uint64
	expr []byte
}

// row is the unwinding rule at one address: how to find the CFA, and the
// rules of the registers the unwinder follows: the frame pointer (rbp,
// x29) and the return address column (the CIE's: x86-64's 16, arm64's
// x30).
type row struct {
	cfaReg  uint64
	cfaOff  int64
	cfaExpr []byte // non-nil: the CFA is what this computes
	fp, ra  rule
}

func (w *row) rule(c *cie, reg uint64) *rule {
	switch reg {
	case c.raReg:
		return &w.ra
	case c.arch.fp:
		return &w.fp
	}
	return nil // a register the unwinder does not track
}

// rowAt runs the CIE's and the FDE's instructions up to target (a file
// virtual address inside the FDE) and returns the row in effect there.
func rowAt(f *fde, target uint64) (row, error) {
	var init row
	if _, err := run(f.cie, f.cie.initial, &init, nil, f.begin, ^uint64(0), nil); err != nil {
		return row{}, fmt.Errorf("CIE instructions: %w", err)
	}
	cur := init
	if _, err := run(f.cie, f.instructions, &cur, &init, f.begin, target, nil); err != nil {
		return row{}, fmt.Errorf("FDE instructions: %w", err)
	}
	return cur, nil
}

// run executes call-frame instructions into w, from location loc, until an
// advance would pass target. init is the CIE's row, for DW_CFA_restore.
// emit, if not nil, is given each row in effect before the location
// advances past it, with the location it starts at (rowsOf: every row of
// an FDE).
func run(c *cie, ins []byte, w *row, init *row, loc, target uint64, emit func(loc uint64, w *row)) (uint64, error) {
	r := &buf{b: ins}
	var saved []row
	advance := func(delta uint64) bool {
		if emit != nil && delta != 0 {
			emit(loc, w)
		}
		loc += delta * c.codeAlign
		return loc > target
	}
	restore := func(reg uint64) {
		if p := w.rule(c, reg); p != nil {
			if init != nil {
				*p = *init.rule(c, reg)
			} else {
				*p = rule{}
			}
		}
	}
	set := func(reg uint64, v rule) {
		if p := w.rule(c, reg); p != nil {
			*p = v
		}
	}
	for r.off < len(r.b) && r.err == nil {
		op := r.u8()
		switch op >> 6 {
		case 1: // DW_CFA_advance_loc
			if advance(uint64(op & 0x3f)) {
				return loc, nil
			}
			continue
		case 2: // DW_CFA_offset
			set(uint64(op&0x3f), rule{kind: ruleOffset, off: int64(r.uleb()) * c.dataAlign})
			continue
		case 3: // DW_CFA_restore
			restore(uint64(op & 0x3f))
			continue
		}
		switch op {
		case 0x00: // nop
		case 0x01: // set_loc
			nl := r.ptr(c.fdeEnc&0x0f, 0, 0)
			if emit != nil && nl != loc {
				emit(loc, w)
			}
			if nl > target {
				return loc, nil
			}
			loc = nl
		case 0x02:
			if advance(uint64(r.u8())) {
				return loc, nil
			}
		case 0x03:
			if advance(uint64(r.u16())) {
				return loc, nil
			}
		case 0x04:
			if advance(uint64(r.u32())) {
				return loc, nil
			}
		case 0x05: // offset_extended
			reg := r.uleb()
			set(reg, rule{kind: ruleOffset, off: int64(r.uleb()) * c.dataAlign})
		case 0x06: // restore_extended
			restore(r.uleb())
		case 0x07: // undefined
			set(r.uleb(), rule{kind: ruleUndef})
		case 0x08: // same_value
			set(r.uleb(), rule{kind: ruleSame})
		case 0x09: // register
			reg := r.uleb()
			set(reg, rule{kind: ruleRegister, reg: r.uleb()})
		case 0x0a: // remember_state
			saved = append(saved, *w)
		case 0x0b: // restore_state
			if len(saved) == 0 {
				return loc, fmt.Errorf("restore_state without remember_state: %w", errBad)
			}
			// The whole row, the CFA rule included, as libgcc's unwinder
			// does: compilers remember before an epilogue and restore after.
			*w = saved[len(saved)-1]
			saved = saved[:len(saved)-1]
		case 0x0c: // def_cfa
			w.cfaReg = r.uleb()
			w.cfaOff = int64(r.uleb())
			w.cfaExpr = nil
		case 0x0d: // def_cfa_register
			w.cfaReg = r.uleb()
			w.cfaExpr = nil
		case 0x0e: // def_cfa_offset
			w.cfaOff = int64(r.uleb())
		case 0x0f: // def_cfa_expression
			w.cfaExpr = r.bytes(int(r.uleb()))
		case 0x10: // expression
			reg := r.uleb()
			set(reg, rule{kind: ruleExpr, expr: r.bytes(int(r.uleb()))})
		case 0x11: // offset_extended_sf
			reg := r.uleb()
			set(reg, rule{kind: ruleOffset, off: r.sleb() * c.dataAlign})
		case 0x12: // def_cfa_sf
			w.cfaReg = r.uleb()
			w.cfaOff = r.sleb() * c.dataAlign
			w.cfaExpr = nil
		case 0x13: // def_cfa_offset_sf
			w.cfaOff = r.sleb() * c.dataAlign
		case 0x14: // val_offset
			reg := r.uleb()
			set(reg, rule{kind: ruleValOffset, off: int64(r.uleb()) * c.dataAlign})
		case 0x15: // val_offset_sf
			reg := r.uleb()
			set(reg, rule{kind: ruleValOffset, off: r.sleb() * c.dataAlign})
		case 0x16: // val_expression
			reg := r.uleb()
			set(reg, rule{kind: ruleValExpr, expr: r.bytes(int(r.uleb()))})
		case 0x2c, 0x2d: // AARCH64_negate_ra_state_with_pc, AARCH64_negate_ra_state (0x2d is SPARC's window_save elsewhere)
			// The return address is signed from here on, or no longer:
			// every arm64 return address is stripped anyway (arch.pac).
			if !c.arch.pac {
				return loc, fmt.Errorf("call-frame instruction %#x not understood for %s", op, c.arch.name)
			}
		case 0x2e: // GNU_args_size
			r.uleb()
		case 0x2f: // GNU_negative_offset_extended
			reg := r.uleb()
			set(reg, rule{kind: ruleOffset, off: -int64(r.uleb()) * c.dataAlign})
		default:
			return loc, fmt.Errorf("call-frame instruction %#x not understood", op)
		}
	}
	return loc, r.err
}
