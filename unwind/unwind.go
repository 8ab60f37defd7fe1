// Package unwind walks x86-64 and arm64 user stacks from call-frame
// information (.eh_frame, .debug_frame) the way a debugger does, for code
// built without frame pointers: CPython, libtorch, libcudart and most -O2
// code. It runs in user space, after the fact, on what a BPF program copied
// into the record at the probe: a few registers and a window of stack
// bytes. The process may be gone; its mapped files are opened by path, and
// their tables are read entry by entry and cached per file. Each file's
// architecture is its ELF header's (arch.go), so an arm64 trace unwinds on
// an x86-64 host too; arm64 return addresses lose their pointer
// authentication bits (Maps.vaMask).
package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"sync"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// MaxFrames bounds an unwound stack, as events.MaxFrames bounds a
// frame-pointer one.
const MaxFrames = events.MaxFrames

// Unwinder unwinds stacks, caching each mapped file's tables. It is safe
// for concurrent use; Close releases the files it holds open.
type Unwinder struct {
	mu     sync.Mutex
	byFile map[fileKey]*tableEntry
	byID   map[string]*tableEntry
}

// New returns an Unwinder with empty caches.
func New() *Unwinder {
	return &Unwinder{byFile: map[fileKey]*tableEntry{}, byID: map[string]*tableEntry{}}
}

// Close closes every file the Unwinder opened. It stays usable.
func (u *Unwinder) Close() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	var errs []error
	closed := map[*table]bool{}
	for _, e := range u.byFile {
		if e.t != nil && !closed[e.t] {
			closed[e.t] = true
			errs = append(errs, e.t.Close())
		}
	}
	u.byFile = map[fileKey]*tableEntry{}
	u.byID = map[string]*tableEntry{}
	return errors.Join(errs...)
}

// Maps is a process's executable mappings sorted for lookup, with each
// one's table once looked up. Build it once per capture of the process. It
// is not safe for concurrent use.
type Maps struct {
	m    []proc.Mapping
	tabs []tabSlot
	last int // the mapping find found last: a stack's frames come in runs in one file
	// vaMask keeps the bits of an address the process's address space
	// uses (up to the highest mapping's end), which is what stripping a
	// return address's pointer authentication code takes: the code sits
	// in the bits above the address space's (48-54 or 52-54 on arm64
	// Linux), bits 56-63 are the ignored top byte, and an address in any
	// mapping has none of them set.
	vaMask uint64

	// memo holds recent unwinds (see Unwind), memoHits counts the unwinds
	// it answered, and reads is the scratch an unwind notes its reads in.
	memo     [memoSlots]memoEntry
	memoHits uint64
	reads    []memRead
}

// memoSlots is how many recent unwinds a process's Maps keeps, by their
// starting registers: a training step allocates from tens of places.
const (
	memoBits  = 6
	memoSlots = 1 << memoBits
)

// memoEntry is one unwind: what it started from, every word it read of
// the window (where, and what it held), and what it gave.
type memoEntry struct {
	ip, sp, bp uint64
	lr         uint64
	n          int  // the window's length
	ipReturn   bool // as Unwind was told
	usedBP     bool // the starting rbp was used: it must match too
	set        bool
	reads      []memRead
	pcs        []uint64
	stop       Stop
}

// memRead is a word the unwinder read: its offset in the window, its value.
type memRead struct {
	off uint32
	val uint64
}

// memoFor is the slot of an unwind starting at regs.
func (m *Maps) memoFor(regs events.Regs) *memoEntry {
	h := (regs.IP ^ regs.SP*0x9e3779b97f4a7c15) * 0xbf58476d1ce4e5b9
	return &m.memo[h>>(64-memoBits)]
}

// answers says whether e is the unwind of regs and window: the same start,
// and every word it read the same.
func (e *memoEntry) answers(regs events.Regs, window []byte, ipReturn bool) bool {
	if !e.set || e.ip != regs.IP || e.sp != regs.SP || e.n != len(window) || e.ipReturn != ipReturn ||
		e.usedBP && e.bp != regs.BP || e.lr != regs.LR {
		return false
	}
	for _, r := range e.reads {
		if binary.LittleEndian.Uint64(window[r.off:]) != r.val {
			return false
		}
	}
	return true
}

type tabSlot struct {
	done bool
	t    *table
	err  error
}

// NewMaps keeps the executable mappings of maps, sorted, and the bits of
// the address space they span.
func NewMaps(maps []proc.Mapping) *Maps {
	var m []proc.Mapping
	var top uint64
	for _, x := range maps {
		if x.Exec() {
			m = append(m, x)
		}
		top = max(top, x.End)
	}
	sort.Slice(m, func(i, j int) bool { return m[i].Start < m[j].Start })
	mask := ^uint64(0)
	if n := bits.Len64(top - 1); top > 0 && n < 64 {
		mask = 1<<n - 1
	}
	return &Maps{m: m, tabs: make([]tabSlot, len(m)), vaMask: mask}
}

func (m *Maps) find(pc uint64) int {
	if i := m.last; i < len(m.m) && pc >= m.m[i].Start && pc < m.m[i].End {
		return i
	}
	i := proc.Find(m.m, pc)
	if i >= 0 {
		m.last = i
	}
	return i
}

// Stop says why an unwind ended.
type Stop struct {
	Kind StopKind
	// Detail says what and where, for a human; for StopWindow, the most
	// common stop, String formats it from win only when asked: records
	// stop there one after another.
	Detail string
	win    windowStop
}

// windowStop is where an unwind left the window: at pc in path, reading
// addr, outside the window [base, end).
type windowStop struct {
	pc, addr, base, end uint64
	path                string
}

// StopKind classifies Stop.
type StopKind uint8

const (
	StopEnd       StopKind = iota // the outermost frame: the return address column is undefined or 0
	StopWindow                    // the next frame's data lies above the copied window
	StopNoMapping                 // an address outside every executable mapping (or in [uprobes]' trampoline)
	StopNoCFI                     // a file without an FDE for the address, or that cannot be read
	StopRule                      // a rule or expression the unwinder does not follow
	StopLoop                      // the stack pointer did not climb
	StopMax                       // MaxFrames reached

	// NumStopKinds is how many kinds of stop there are: the size of an
	// array indexed by StopKind.
	NumStopKinds = int(StopMax) + 1
)

func (s Stop) String() string {
	if s.Kind == StopWindow && s.Detail == "" {
		w := s.win
		return fmt.Sprintf("at %#x (%s): %#x: %v (%#x to %#x)", w.pc, w.path, w.addr, errWindow, w.base, w.end)
	}
	return s.Detail
}

// Unwind walks the stack from regs through window, the stack bytes from
// regs.SP up, and appends the return addresses to pcs (regs.IP first).
// ipReturn says regs.IP is itself a return address, as at a return probe;
// at a probe inside a function body (USDT) it is not.
//
// An unwind is a function of its starting registers, the words of the
// window it reads, and maps: the same start with the same words read gives
// the same frames. So maps keeps recent unwinds (memoSlots, by where they
// started) with the words each read, and a record whose start and words
// match one is answered from it. An allocation made again from the same
// place (a loop; each step of a training job) is then a comparison of the
// words (tens, independent of each other: their cache misses overlap)
// where the unwind looked up a row per frame and waited on each read in
// turn. rbp saved by a frame is read only when a rule needs it: code
// without frame pointers saves rbp as a scratch register whose value
// changes from call to call, and reading it would make every unwind new.
func (u *Unwinder) Unwind(maps *Maps, regs events.Regs, window []byte, ipReturn bool, pcs []uint64) ([]uint64, Stop) {
	e := maps.memoFor(regs)
	if e.answers(regs, window, ipReturn) {
		maps.memoHits++
		return append(pcs, e.pcs...), e.stop
	}
	first := len(pcs)
	maps.reads = maps.reads[:0]
	usedBP := false
	pcs, stop := u.unwind(maps, regs, window, ipReturn, pcs, &maps.reads, &usedBP)
	*e = memoEntry{ip: regs.IP, sp: regs.SP, bp: regs.BP, lr: regs.LR, n: len(window), ipReturn: ipReturn, usedBP: usedBP, set: true,
		reads: append(e.reads[:0], maps.reads...), pcs: append(e.pcs[:0], pcs[first:]...), stop: stop}
	return pcs, stop
}

// unwind is Unwind without the memo: it notes every word it reads of the
// window in reads, and sets usedBP when the starting rbp was used.
func (u *Unwinder) unwind(maps *Maps, regs events.Regs, window []byte, ipReturn bool, pcs []uint64, reads *[]memRead, usedBP *bool) ([]uint64, Stop) {
	mem := memory{base: regs.SP, b: window, reads: reads}
	back := uint64(0)
	if ipReturn {
		back = 1
	}
	// The frame pointer is the starting register's (bpInit), known (bpOK),
	// or saved at bpAt by a frame and read when a rule needs it
	// (state.reg). arm64's link register is known in the first frame only,
	// where the record has it (regs.LR): in a caller it is the return
	// address the callee's rules gave, which no rule of the caller's may
	// give back.
	pc, sp, bp, bpAt := regs.IP, regs.SP, regs.BP, uint64(0)
	bpOK, bpInit := true, true
	lr, lrOK := regs.LR, regs.LR != 0
	pcs = append(pcs, pc)
	for len(pcs) < MaxFrames {
		i := maps.find(pc)
		if i < 0 || !maps.m[i].File() {
			return pcs, Stop{Kind: StopNoMapping, Detail: fmt.Sprintf("%#x is in no mapped file", pc)}
		}
		m := &maps.m[i]
		slot := &maps.tabs[i]
		if !slot.done {
			slot.t, slot.err = u.table(m)
			slot.done = true
		}
		t, err := slot.t, slot.err
		if err != nil {
			return pcs, Stop{Kind: StopNoCFI, Detail: fmt.Sprintf("%s: %v", m.Path, err)}
		}
		v, ok := t.vaddr(pc - m.Start + m.Offset)
		if !ok {
			return pcs, Stop{Kind: StopNoCFI, Detail: fmt.Sprintf("%#x is outside %s's segments", pc, m.Path)}
		}
		// Every pc here but a signal frame's is a return address: the call
		// it returns from is one byte back, and that is the row that holds
		// while the callee runs (the call may end its function, and the
		// return address be another's first byte).
		w, err := t.rowFor(v - back)
		if err != nil {
			return pcs, Stop{Kind: StopNoCFI, Detail: fmt.Sprintf("%#x (%s+%#x): %v", pc, m.Path, v, err)}
		}
		a := t.arch
		st := state{a: a, pc: pc, sp: sp, bp: bp, bpOK: bpOK, bpAt: bpAt, bpInit: bpInit, lr: lr, lrOK: lrOK, mem: &mem, usedBP: usedBP}
		cfa, err := st.cfa(w)
		if err != nil {
			return pcs, stopFor(err, pc, m.Path, &mem)
		}
		if w.ra.kind == ruleUndef {
			return pcs, Stop{Kind: StopEnd, Detail: "end of stack"}
		}
		var ra uint64
		if w.ra.kind == ruleSame {
			// Only a link register keeps the return address unsaved.
			if !a.lrReg || !lrOK {
				return pcs, Stop{Kind: StopRule, Detail: fmt.Sprintf("at %#x (%s): no rule for the return address", pc, m.Path)}
			}
			ra = lr
		} else {
			ra, ok, err = st.apply(&w.ra, cfa)
			if err != nil || !ok {
				if err == nil {
					err = errors.New("return address rule")
				}
				return pcs, stopFor(err, pc, m.Path, &mem)
			}
		}
		if a.pac {
			ra &= maps.vaMask
		}
		if ra == 0 {
			return pcs, Stop{Kind: StopEnd, Detail: "end of stack"}
		}
		// The CFA climbs the stack: on x86-64 a call pushes its return
		// address, and on arm64 a frame that saved its return address
		// took room for it; only one whose return address is still in the
		// link register (a leaf, with the first frame's register known)
		// may have its CFA at the stack pointer.
		if cfa < sp || cfa == sp && (w.ra.kind != ruleSame || !a.lrReg) {
			return pcs, Stop{Kind: StopLoop, Detail: fmt.Sprintf("CFA %#x at or below sp %#x at %#x", cfa, sp, pc)}
		}
		// The caller's frame pointer. One saved by this frame stays in
		// memory until a rule needs it; one that cannot be read then is
		// unknown, as it was when read at once: only frames whose rules
		// need it stop.
		switch w.fp.kind {
		case ruleSame: // st's: reg may have read it meanwhile
			bp, bpOK, bpAt, bpInit = st.bp, st.bpOK, st.bpAt, st.bpInit
		case ruleUndef:
			bp, bpOK, bpAt, bpInit = 0, false, 0, false
		case ruleOffset:
			bp, bpOK, bpAt, bpInit = 0, true, cfa+uint64(w.fp.off), false
		default:
			v, ok, err := st.apply(&w.fp, cfa)
			bp, bpOK, bpAt, bpInit = v, ok && err == nil, 0, false
		}
		pc, sp = ra, cfa
		lr, lrOK = 0, false
		back = 1
		pcs = append(pcs, pc)
	}
	return pcs, Stop{Kind: StopMax, Detail: fmt.Sprintf("%d frames", MaxFrames)}
}

var (
	errWindow = errors.New("above the copied stack window")
	errRule   = errors.New("rule not followed")
)

// stopFor is the Stop of err, met at pc in path reading mem.
func stopFor(err error, pc uint64, path string, mem *memory) Stop {
	if errors.Is(err, errWindow) {
		w := mem.stop
		w.pc, w.path = pc, path
		return Stop{Kind: StopWindow, win: w}
	}
	return Stop{Kind: StopRule, Detail: fmt.Sprintf("at %#x (%s): %v", pc, path, err)}
}

// memory is the copied stack window: the only memory the unwinder reads.
type memory struct {
	base uint64
	b    []byte
	// stop notes a read outside the window, returned as errWindow itself:
	// most unwinds end there, and formatting it each time cost more than
	// the rest of the unwind (Stop.String formats it when asked).
	stop windowStop
	// reads, when set, gets every word read inside the window (the memo).
	reads *[]memRead
}

func (m *memory) read(addr uint64) (uint64, error) {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(m.b))-(addr-m.base) < 8 {
		m.stop = windowStop{addr: addr, base: m.base, end: m.base + uint64(len(m.b))}
		return 0, errWindow
	}
	v := binary.LittleEndian.Uint64(m.b[addr-m.base:])
	if m.reads != nil {
		*m.reads = append(*m.reads, memRead{off: uint32(addr - m.base), val: v})
	}
	return v, nil
}

// state is one frame's registers as far as they are known, for its arch
// a. The frame pointer is known (bpOK), or saved at bpAt and read from
// there when first needed; bpInit says it is still the starting
// register's value, and usedBP notes that that value was used. lr is
// arm64's link register, where known (lrOK).
type state struct {
	a          *arch
	pc, sp, bp uint64
	bpOK       bool
	bpAt       uint64
	bpInit     bool
	lr         uint64
	lrOK       bool
	mem        *memory
	usedBP     *bool
}

func (s *state) reg(r uint64) (uint64, error) {
	switch r {
	case s.a.sp:
		return s.sp, nil
	case s.a.fp:
		if s.bpAt != 0 {
			v, err := s.mem.read(s.bpAt)
			s.bp, s.bpOK, s.bpAt = v, err == nil, 0
		}
		if s.bpOK {
			if s.bpInit && s.usedBP != nil {
				*s.usedBP = true
			}
			return s.bp, nil
		}
		return 0, fmt.Errorf("the frame pointer is unknown in this frame: %w", errRule)
	case s.a.ra:
		if !s.a.lrReg {
			return s.pc, nil // x86-64's column 16 is rip
		}
		if s.lrOK {
			return s.lr, nil
		}
		return 0, fmt.Errorf("the link register is unknown in this frame: %w", errRule)
	}
	return 0, fmt.Errorf("CFA from DWARF register %d: %w", r, errRule)
}

func (s *state) cfa(w *row) (uint64, error) {
	if w.cfaExpr != nil {
		return s.eval(w.cfaExpr, 0, false)
	}
	v, err := s.reg(w.cfaReg)
	return v + uint64(w.cfaOff), err
}

// apply gives a register's value in the caller under rule r; ok is false
// when the rule leaves it unknown. "Same" and "undefined" never get here:
// unwind takes them itself, for the return address and the frame pointer.
func (s *state) apply(r *rule, cfa uint64) (uint64, bool, error) {
	switch r.kind {
	case ruleOffset:
		v, err := s.mem.read(cfa + uint64(r.off))
		return v, err == nil, err
	case ruleValOffset:
		return cfa + uint64(r.off), true, nil
	case ruleRegister:
		v, err := s.reg(r.reg)
		return v, err == nil, err
	case ruleExpr:
		addr, err := s.eval(r.expr, cfa, true)
		if err != nil {
			return 0, false, err
		}
		v, err := s.mem.read(addr)
		return v, err == nil, err
	case ruleValExpr:
		v, err := s.eval(r.expr, cfa, true)
		return v, err == nil, err
	}
	return 0, false, errRule
}

// eval runs a DWARF expression of the kinds compilers put in CFI: register
// plus offset, dereference, and the arithmetic of PLT entries. push starts
// the stack with cfa (register rules).
func (s *state) eval(expr []byte, cfa uint64, push bool) (uint64, error) {
	var st []uint64
	if push {
		st = append(st, cfa)
	}
	r := &buf{b: expr}
	pop := func() uint64 {
		if len(st) == 0 {
			r.fail()
			return 0
		}
		v := st[len(st)-1]
		st = st[:len(st)-1]
		return v
	}
	for r.off < len(r.b) && r.err == nil {
		op := r.u8()
		switch {
		case op >= 0x30 && op <= 0x4f: // lit0..31
			st = append(st, uint64(op-0x30))
		case op >= 0x70 && op <= 0x8f: // breg0..31
			v, err := s.reg(uint64(op - 0x70))
			if err != nil {
				return 0, err
			}
			st = append(st, v+uint64(r.sleb()))
		case op == 0x92: // bregx
			v, err := s.reg(r.uleb())
			if err != nil {
				return 0, err
			}
			st = append(st, v+uint64(r.sleb()))
		case op == 0x06: // deref
			v, err := s.mem.read(pop())
			if err != nil {
				return 0, err
			}
			st = append(st, v)
		case op == 0x08:
			st = append(st, uint64(r.u8()))
		case op == 0x09:
			st = append(st, uint64(int64(int8(r.u8()))))
		case op == 0x0a:
			st = append(st, uint64(r.u16()))
		case op == 0x0b:
			st = append(st, uint64(int64(int16(r.u16()))))
		case op == 0x0c:
			st = append(st, uint64(r.u32()))
		case op == 0x0d:
			st = append(st, uint64(int64(int32(r.u32()))))
		case op == 0x0e, op == 0x0f:
			st = append(st, r.u64())
		case op == 0x10:
			st = append(st, r.uleb())
		case op == 0x11:
			st = append(st, uint64(r.sleb()))
		case op == 0x12: // dup
			v := pop()
			st = append(st, v, v)
		case op == 0x13: // drop
			pop()
		case op == 0x23: // plus_uconst
			st = append(st, pop()+r.uleb())
		case op == 0x1a, op == 0x1c, op == 0x22, op == 0x24, op == 0x25, op == 0x21, op == 0x27,
			op >= 0x29 && op <= 0x2e:
			b, a := pop(), pop()
			st = append(st, binop(op, a, b))
		default:
			return 0, fmt.Errorf("DWARF expression op %#x: %w", op, errRule)
		}
	}
	if r.err != nil || len(st) == 0 {
		return 0, fmt.Errorf("DWARF expression: %w", errRule)
	}
	return st[len(st)-1], nil
}

func binop(op uint8, a, b uint64) uint64 {
	bool64 := func(c bool) uint64 {
		if c {
			return 1
		}
		return 0
	}
	switch op {
	case 0x1a:
		return a & b
	case 0x1c:
		return a - b
	case 0x21:
		return a | b
	case 0x22:
		return a + b
	case 0x24:
		return a << (b & 63)
	case 0x25:
		return a >> (b & 63)
	case 0x27:
		return a ^ b
	case 0x29:
		return bool64(a == b)
	case 0x2a:
		return bool64(int64(a) >= int64(b))
	case 0x2b:
		return bool64(int64(a) > int64(b))
	case 0x2c:
		return bool64(int64(a) <= int64(b))
	case 0x2d:
		return bool64(int64(a) < int64(b))
	case 0x2e:
		return bool64(a != b)
	}
	return 0
}

// Merge chooses between a frame-pointer stack and one unwound from CFI,
// both starting at the same instruction. A CFI unwind that reached the end
// of the stack is complete and wins: through code without frame pointers
// the frame-pointer walk follows a stale rbp and may even go "deeper" on
// garbage. Where the CFI unwind stopped short (the window ended, a file
// without CFI) and its last frame is also in the frame-pointer stack, the
// frame-pointer frames past it continue it: they climbed the same chain.
// Otherwise the deeper of the two is returned, the CFI one on a tie.
func Merge(fp, cfi []uint64, stop Stop) []uint64 {
	if len(cfi) == 0 {
		return fp
	}
	if stop.Kind == StopEnd {
		return cfi
	}
	if len(cfi) > 1 {
		last := cfi[len(cfi)-1]
		for i := 1; i < len(fp); i++ {
			if fp[i] == last {
				for _, pc := range fp[i+1:] {
					if len(cfi) == MaxFrames {
						break
					}
					cfi = append(cfi, pc)
				}
				break
			}
		}
	}
	if len(fp) > len(cfi) {
		return fp
	}
	return cfi
}
