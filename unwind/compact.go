package unwind

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"

	"github.com/cudatrace/cudatrace/proc"
)

// Compact is one file's call-frame information reduced to what the BPF
// unwinder follows (bpf/unwind.h): for each range of addresses where the
// rules change, how to find the CFA (the stack pointer or the frame pointer
// plus an offset) and where the return address and the frame pointer were
// saved. A range whose rules it does not follow (a DWARF expression: PLT
// entries, signal frames; a CFA from another register; an address no FDE
// covers) is a row of CFANone, where BPF falls back to copying the window
// for this unwinder to unwind: a stack comes out the same either way.
type Compact struct {
	Rows  []CompactRow // sorted by PC; each holds up to the next
	loads []load
}

// CompactRow mirrors struct ct_uw_row (bpf/cudatrace.h).
type CompactRow struct {
	PC     uint32 // file virtual address where the row starts
	CFA    uint8  // CFA*
	FP     uint8  // Reg*: the frame pointer (rbp, x29)
	RA     uint8  // Reg*: the return address
	CFAOff int32
	FPOff  int16
	RAOff  int16
}

// The kinds of a CompactRow's rules: enum ct_uw_cfa and enum ct_uw_reg.
const (
	CFANone = 0 // not followed in BPF: fall back
	CFASP   = 1 // CFA = sp + CFAOff
	CFAFP   = 2 // CFA = fp + CFAOff

	RegSame   = 0 // unchanged (the frame pointer only)
	RegOffset = 1 // saved at CFA + off
	RegUndef  = 2 // the frame pointer: unknown; the return address: none, the stack's end
	RegLR     = 3 // the return address is in the link register (arm64)
)

// CompactFile reduces the call-frame information of the ELF file f (at
// path, for errors) to rows. f is closed. A large library takes tens of
// milliseconds (libc: ~3,000 FDEs); it stops with ctx's error once ctx
// is done.
func CompactFile(ctx context.Context, f *os.File, path string) (*Compact, error) {
	t, err := openTable(f, path)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	return t.compact(ctx)
}

// fdeRef is an FDE in the order the unwinder finds them: by where it
// begins, the later of two beginning at the same address winning, as the
// search of .eh_frame_hdr's table does.
type fdeRef struct {
	begin uint64
	off   uint64
}

func (t *table) compact(ctx context.Context) (*Compact, error) {
	c := &Compact{loads: t.loads}
	var eh, debug []taggedRow
	var err error
	if t.eh != nil {
		if eh, err = t.sectionRows(ctx, t.eh); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.debug != nil {
		if debug, err = t.sectionRows(ctx, t.debug); err != nil && t.eh == nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// An address .eh_frame has no FDE for is looked up in .debug_frame
	// (table.fdeFor): the union of their boundaries, each range the rule
	// of the first that has an FDE for it.
	var pcs []uint64
	for _, r := range eh {
		pcs = append(pcs, r.pc)
	}
	for _, r := range debug {
		pcs = append(pcs, r.pc)
	}
	slices.Sort(pcs)
	pcs = slices.Compact(pcs)
	at := func(rows []taggedRow, pc uint64) taggedRow {
		i := sort.Search(len(rows), func(i int) bool { return rows[i].pc > pc }) - 1
		if i < 0 {
			return taggedRow{}
		}
		return rows[i]
	}
	for _, pc := range pcs {
		r := at(eh, pc)
		if !r.fde {
			r = at(debug, pc)
		}
		row := r.row
		row.PC = uint32(pc)
		if n := len(c.Rows); n > 0 {
			same := c.Rows[n-1]
			same.PC = row.PC
			if same == row {
				continue
			}
		}
		c.Rows = append(c.Rows, row)
	}
	return c, nil
}

// taggedRow is a row of one section, and whether an FDE holds there.
type taggedRow struct {
	pc  uint64
	row CompactRow
	fde bool
}

// sectionRows is every row of the FDEs of s (.eh_frame or .debug_frame),
// by address, with the ranges no FDE covers.
func (t *table) sectionRows(ctx context.Context, s *section) ([]taggedRow, error) {
	var refs []fdeRef
	if s == t.eh && t.hdr != nil {
		for i := 0; i < len(t.hdr)/8; i++ {
			at := func(j int) uint64 {
				return t.hdrAddr + uint64(int64(int32(leUint32(t.hdr[8*i+j:]))))
			}
			refs = append(refs, fdeRef{begin: at(0), off: at(4) - t.eh.addr})
		}
	} else {
		idx, err := t.scan(s)
		if err != nil && len(idx) == 0 {
			return nil, err
		}
		for _, e := range idx {
			refs = append(refs, fdeRef{begin: e.begin, off: e.off})
		}
	}
	sort.SliceStable(refs, func(i, j int) bool { return refs[i].begin < refs[j].begin })
	var rows []taggedRow
	add := func(pc uint64, r CompactRow, fde bool) {
		if n := len(rows); n > 0 && rows[n-1].pc == pc {
			rows[n-1] = taggedRow{pc, r, fde}
			return
		}
		rows = append(rows, taggedRow{pc, r, fde})
	}
	for i, ref := range refs {
		if i%256 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if i+1 < len(refs) && refs[i+1].begin == ref.begin {
			continue // the later one is found
		}
		f, err := t.fdeAt(s, ref.off)
		if err != nil || f.end <= f.begin {
			add(ref.begin, CompactRow{}, err != nil)
			continue
		}
		if f.end > 1<<32 {
			return nil, fmt.Errorf("code at %#x and above: rows hold 32-bit addresses", f.begin)
		}
		end := f.end
		if i+1 < len(refs) && refs[i+1].begin < end {
			end = refs[i+1].begin
		}
		a := f.cie.arch
		var init row
		if _, err := run(f.cie, f.cie.initial, &init, nil, f.begin, ^uint64(0), nil); err != nil {
			add(f.begin, CompactRow{}, true)
			if end == f.end {
				add(end, CompactRow{}, false)
			}
			continue
		}
		cur := init
		emit := func(loc uint64, w *row) {
			if loc >= f.begin && loc < end {
				add(loc, compactOf(a, w), true)
			}
		}
		loc, err := run(f.cie, f.instructions, &cur, &init, f.begin, ^uint64(0), emit)
		if loc < end {
			if err != nil {
				add(loc, CompactRow{}, true) // from the instruction not understood on
			} else {
				add(loc, compactOf(a, &cur), true)
			}
		}
		if end == f.end {
			add(end, CompactRow{}, false) // up to the next FDE, if any
		}
	}
	return rows, nil
}

func leUint32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// compactOf reduces the row w of architecture a to what BPF follows: the
// rules unwind (unwind.go) follows for the CFA, the return address and the
// frame pointer, where they are a register plus an offset or a saved slot;
// anything else is CFANone.
func compactOf(a *arch, w *row) CompactRow {
	var c CompactRow
	if w.cfaExpr != nil || w.cfaOff != int64(int32(w.cfaOff)) {
		return CompactRow{}
	}
	switch w.cfaReg {
	case a.sp:
		c.CFA = CFASP
	case a.fp:
		c.CFA = CFAFP
	default:
		return CompactRow{}
	}
	c.CFAOff = int32(w.cfaOff)
	switch w.ra.kind {
	case ruleUndef:
		c.RA = RegUndef
		return c // the stack ends: the frame pointer's rule is not used
	case ruleOffset:
		if w.ra.off != int64(int16(w.ra.off)) {
			return CompactRow{}
		}
		c.RA, c.RAOff = RegOffset, int16(w.ra.off)
	case ruleSame:
		if !a.lrReg {
			return CompactRow{}
		}
		c.RA = RegLR
	default:
		return CompactRow{}
	}
	switch w.fp.kind {
	case ruleSame:
		c.FP = RegSame
	case ruleUndef:
		c.FP = RegUndef
	case ruleOffset:
		if w.fp.off != int64(int16(w.fp.off)) {
			return CompactRow{}
		}
		c.FP, c.FPOff = RegOffset, int16(w.fp.off)
	default:
		return CompactRow{}
	}
	return c
}

// CompactMapping is the part of an executable mapping of the file whose
// addresses BPF unwinds with its rows: an address a in [Start, End) is
// file virtual address a - Bias.
type CompactMapping struct {
	Start, End, Bias uint64
}

// Mappings gives the parts of m, a mapping of c's file, that lie in its
// executable segments, each with its bias, as unwind finds a row for an
// address of m (table.vaddr: the executable segment that holds its file
// offset).
func (c *Compact) Mappings(m proc.Mapping) []CompactMapping {
	var out []CompactMapping
	for _, l := range c.loads {
		if !l.exec {
			continue
		}
		// File offsets m covers, clipped to the segment's.
		lo, hi := max(m.Offset, l.off), min(m.Offset+(m.End-m.Start), l.off+l.filesz)
		if lo >= hi {
			continue
		}
		out = append(out, CompactMapping{
			Start: m.Start + (lo - m.Offset),
			End:   m.Start + (hi - m.Offset),
			Bias:  m.Start - m.Offset + l.off - l.vaddr,
		})
	}
	return out
}
