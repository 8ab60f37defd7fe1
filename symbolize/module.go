package symbolize

import (
	"bytes"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/ianlancetaylor/demangle"
	"github.com/ulikunitz/xz"
)

// module is what symbolization needs from one ELF file, copied out of it so
// the file can be closed: thousands of mapped libraries must not pin
// thousands of descriptors.
type module struct {
	buildID string
	loads   []load

	syms   []symbol // sorted by start, one per start address
	symtab bool     // syms came from .symtab, not just .dynsym

	// .gnu_debuglink: the separate debug file's name and CRC-32.
	debuglink    string
	debuglinkCRC uint32

	lines    []lineRow // sorted by addr
	files    []string  // lineRow.file indexes this
	hasLines bool

	mu        sync.Mutex
	demangled map[int]string
}

type load struct {
	off, filesz, vaddr, memsz uint64
	exec                      bool
}

type symbol struct {
	start, end uint64
	name       string // raw, as in the symbol table
}

// lineRow says that code from addr up to the next row's addr comes from
// files[file]:line. A row with file == endSeq ends a sequence: what follows
// it, up to the next row, has no line information.
type lineRow struct {
	addr uint64
	file uint32
	line uint32
}

const endSeq = ^uint32(0)

// parseModule reads what it can of f; a non-nil error says what it could
// not, and the module is still usable for the rest.
func parseModule(f *elf.File, path string) (*module, error) {
	mod := &module{}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD {
			continue
		}
		mod.loads = append(mod.loads, load{
			off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr, memsz: p.Memsz,
			exec: p.Flags&elf.PF_X != 0,
		})
	}
	if sec := f.Section(".gnu_debuglink"); sec != nil {
		if b, err := sec.Data(); err == nil {
			if i := bytes.IndexByte(b, 0); i > 0 && len(b) >= 4 {
				mod.debuglink = string(b[:i])
				mod.debuglinkCRC = binary.LittleEndian.Uint32(b[len(b)-4:])
			}
		}
	}
	var errs []error
	if err := mod.readSymbols(f); err != nil {
		errs = append(errs, fmt.Errorf("read symbols of %s: %w", path, err))
	}
	if err := mod.addMiniDebugInfo(f); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	}
	if err := mod.readLines(f); err != nil {
		errs = append(errs, fmt.Errorf("read line table of %s: %w", path, err))
	}
	return mod, errors.Join(errs...)
}

// vaddr converts a file offset to the virtual address the file's own
// headers give it. exec prefers an executable segment, which matters only
// when segments share file bytes.
func (m *module) vaddr(off uint64, exec bool) (uint64, bool) {
	found, ok := uint64(0), false
	for _, l := range m.loads {
		if off < l.off || off-l.off >= l.filesz {
			continue
		}
		v := off - l.off + l.vaddr
		if l.exec == exec {
			return v, true
		}
		if !ok {
			found, ok = v, true
		}
	}
	return found, ok
}

// vaddrInSegment converts an offset into a mapping to a virtual address
// for a module parsed from a separate debug file, whose segments keep their
// addresses but not their file bytes (p_filesz 0), so file offsets say
// nothing. The kernel maps a segment from its first page: a mapping of the
// only segment with its permissions starts at that segment's first page.
func (m *module) vaddrInSegment(off uint64, exec bool) (uint64, bool) {
	var cand *load
	for i := range m.loads {
		l := &m.loads[i]
		if l.exec == exec {
			if l.filesz != 0 {
				return 0, false // its file offsets were right, and did not hold off
			}
			if cand != nil {
				return 0, false // which one is mapped here is not known
			}
			cand = l
		}
	}
	if cand == nil {
		return 0, false
	}
	const page = 4096
	v := cand.vaddr&^(page-1) + off
	if v < cand.vaddr || v-cand.vaddr >= cand.memsz {
		return 0, false
	}
	return v, true
}

func (m *module) readSymbols(f *elf.File) error {
	syms, err := f.Symbols()
	symtab := err == nil
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return err
	}
	if !hasFuncs(syms) {
		// Stripped files keep .dynsym for the dynamic linker, which still
		// names every exported function.
		dyn, derr := f.DynamicSymbols()
		if derr != nil && !errors.Is(derr, elf.ErrNoSymbols) {
			return derr
		}
		syms, symtab = dyn, false
	}
	m.setSymbols(symbolSet{f, syms})
	m.symtab = symtab
	return nil
}

// symbolSet is a symbol table with the file whose section headers its
// symbols' section indexes refer to.
type symbolSet struct {
	f    *elf.File
	syms []elf.Symbol
}

// setSymbols makes m's sorted function table from one or more symbol
// tables (.dynsym and MiniDebugInfo's .symtab complete each other).
func (m *module) setSymbols(sets ...symbolSet) {
	type cand struct {
		symbol
		bind elf.SymBind
	}
	var cands []cand
	for _, set := range sets {
		for _, s := range set.syms {
			typ := elf.ST_TYPE(s.Info)
			if typ != elf.STT_FUNC && typ != elf.STT_LOOS /* STT_GNU_IFUNC */ {
				continue
			}
			if s.Section == elf.SHN_UNDEF || s.Value == 0 || s.Name == "" {
				continue
			}
			end := s.Value + s.Size
			if s.Size == 0 || end < s.Value {
				// Unsized (hand-written assembly, mostly): it runs at most to
				// the end of its section.
				end = ^uint64(0)
				if int(s.Section) < len(set.f.Sections) {
					sec := set.f.Sections[s.Section]
					if e := sec.Addr + sec.Size; e > s.Value {
						end = e
					}
				}
			}
			name, _, _ := strings.Cut(s.Name, "@") // drop version: cudaMalloc@@libcudart.so.11.0
			cands = append(cands, cand{symbol{start: s.Value, end: end, name: name}, elf.ST_BIND(s.Info)})
		}
	}
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := &cands[i], &cands[j]
		if a.start != b.start {
			return a.start < b.start
		}
		return better(a.name, a.bind, b.name, b.bind)
	})
	m.syms = m.syms[:0]
	for i, c := range cands {
		if i > 0 && c.start == cands[i-1].start {
			// An alias: the first (preferred) name stays; it covers as far
			// as any of its aliases does.
			last := &m.syms[len(m.syms)-1]
			if c.end > last.end && last.end != ^uint64(0) {
				last.end = c.end
			}
			continue
		}
		m.syms = append(m.syms, c.symbol)
	}
}

// maxMiniDebugInfo bounds the decompressed .gnu_debugdata: Fedora's are a
// few MB for the largest libraries.
const maxMiniDebugInfo = 256 << 20

// addMiniDebugInfo adds the symbols of f's MiniDebugInfo (.gnu_debugdata:
// an xz-compressed ELF whose .symtab holds the functions .dynsym lacks, as
// Fedora, CentOS and others ship) to a module that has only .dynsym.
func (m *module) addMiniDebugInfo(f *elf.File) error {
	sec := f.Section(".gnu_debugdata")
	if sec == nil || m.symtab {
		return nil
	}
	r, err := xz.NewReader(sec.Open())
	if err != nil {
		return fmt.Errorf("MiniDebugInfo: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(r, maxMiniDebugInfo+1))
	if err != nil {
		return fmt.Errorf("MiniDebugInfo: %w", err)
	}
	if len(data) > maxMiniDebugInfo {
		return fmt.Errorf("MiniDebugInfo: more than %d bytes decompressed", maxMiniDebugInfo)
	}
	mini, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("MiniDebugInfo: %w", err)
	}
	syms, err := mini.Symbols()
	if err != nil {
		return fmt.Errorf("MiniDebugInfo: %w", err)
	}
	dyn, _ := f.DynamicSymbols()
	m.setSymbols(symbolSet{f, dyn}, symbolSet{mini, syms})
	m.symtab = true
	return nil
}

// better orders aliases of one address so that the name a user would
// recognize comes first: malloc, not __libc_malloc.
func better(a string, ab elf.SymBind, b string, bb elf.SymBind) bool {
	rank := func(bind elf.SymBind) int {
		switch bind {
		case elf.STB_GLOBAL:
			return 0
		case elf.STB_WEAK:
			return 1
		}
		return 2
	}
	if ra, rb := rank(ab), rank(bb); ra != rb {
		return ra < rb
	}
	ua := len(a) - len(strings.TrimLeft(a, "_"))
	ub := len(b) - len(strings.TrimLeft(b, "_"))
	if ua != ub {
		return ua < ub
	}
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func hasFuncs(syms []elf.Symbol) bool {
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF {
			return true
		}
	}
	return false
}

// function names the symbol containing pc, demangled.
func (m *module) function(pc uint64) string {
	i := sort.Search(len(m.syms), func(i int) bool { return m.syms[i].start > pc }) - 1
	if i < 0 || pc >= m.syms[i].end {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if name, ok := m.demangled[i]; ok {
		return name
	}
	// Demangled on demand: a CUDA library has hundreds of thousands of
	// symbols and a trace touches a few dozen.
	name := demangleName(m.syms[i].name)
	if m.demangled == nil {
		m.demangled = map[int]string{}
	}
	m.demangled[i] = name
	return name
}

func demangleName(name string) (out string) {
	defer func() {
		if recover() != nil {
			out = name
		}
	}()
	return demangle.Filter(name)
}

// readLines flattens every line table of f into one sorted table, so that a
// lookup is one binary search rather than a walk of compile units' ranges.
func (m *module) readLines(f *elf.File) error {
	if f.Section(".debug_info") == nil && f.Section(".zdebug_info") == nil {
		return nil
	}
	if f.Section(".debug_line") == nil && f.Section(".zdebug_line") == nil {
		return nil
	}
	d, err := f.DWARF()
	if err != nil {
		return err
	}
	b := lineBuilder{m: m, fileIdx: map[string]uint32{}}
	var errs []error
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil {
			errs = append(errs, err)
			break
		}
		if e == nil {
			break
		}
		if e.Tag != dwarf.TagCompileUnit && e.Tag != dwarf.TagPartialUnit {
			r.SkipChildren()
			continue
		}
		lr, err := d.LineReader(e)
		r.SkipChildren()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if lr == nil {
			continue
		}
		if err := b.unit(lr); err != nil {
			errs = append(errs, err)
		}
	}
	b.finish()
	m.hasLines = len(m.lines) > 0
	return errors.Join(errs...)
}

type lineBuilder struct {
	m       *module
	fileIdx map[string]uint32
	seq     []lineRow
}

func (b *lineBuilder) unit(lr *dwarf.LineReader) error {
	var le dwarf.LineEntry
	b.seq = b.seq[:0]
	for {
		if err := lr.Next(&le); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if le.EndSequence {
			b.endSequence(le.Address)
			continue
		}
		row := lineRow{addr: le.Address, file: endSeq, line: uint32(le.Line)}
		if le.File != nil && le.Line > 0 {
			row.file = b.file(le.File.Name)
		} else {
			row.line = 0
			row.file = b.file("") // a row without a line still ends the previous one's range
		}
		n := len(b.seq)
		switch {
		case n > 0 && b.seq[n-1].addr == row.addr:
			// Several rows at one address: the earlier ones cover no code.
			b.seq[n-1] = row
		case n > 0 && b.seq[n-1].file == row.file && b.seq[n-1].line == row.line:
			// Same place as before: keeping only the first row of a run
			// keeps the table small without changing any answer.
		default:
			b.seq = append(b.seq, row)
		}
	}
}

func (b *lineBuilder) file(name string) uint32 {
	i, ok := b.fileIdx[name]
	if !ok {
		i = uint32(len(b.m.files))
		b.m.files = append(b.m.files, name)
		b.fileIdx[name] = i
	}
	return i
}

func (b *lineBuilder) endSequence(end uint64) {
	seq := b.seq
	b.seq = b.seq[:0]
	if len(seq) == 0 || !b.inCode(seq[0].addr) {
		// Sequences of functions the linker dropped keep a tombstone
		// address (0 or -1) that would otherwise shadow real code.
		return
	}
	b.m.lines = append(b.m.lines, seq...)
	b.m.lines = append(b.m.lines, lineRow{addr: end, file: endSeq})
}

func (b *lineBuilder) inCode(addr uint64) bool {
	anyExec := false
	for _, l := range b.m.loads {
		if !l.exec {
			continue
		}
		anyExec = true
		if addr >= l.vaddr && addr-l.vaddr < l.memsz {
			return true
		}
	}
	return !anyExec
}

func (b *lineBuilder) finish() {
	rows := b.m.lines
	// At equal addresses an end of sequence sorts first, so the sequence
	// starting there wins the lookup (which takes the last row <= pc).
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].addr != rows[j].addr {
			return rows[i].addr < rows[j].addr
		}
		return rows[i].file == endSeq && rows[j].file != endSeq
	})
	out := rows[:0]
	for _, r := range rows {
		if n := len(out); n > 0 && out[n-1].addr == r.addr {
			out[n-1] = r
			continue
		}
		out = append(out, r)
	}
	b.m.lines = out[:len(out):len(out)]
}

// line gives the source position of pc, or ("", 0).
func (m *module) line(pc uint64) (string, int) {
	i := sort.Search(len(m.lines), func(i int) bool { return m.lines[i].addr > pc }) - 1
	if i < 0 {
		return "", 0
	}
	r := m.lines[i]
	if r.file == endSeq || r.line == 0 || int(r.file) >= len(m.files) {
		return "", 0
	}
	return m.files[r.file], int(r.line)
}
