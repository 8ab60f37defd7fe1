package unwind

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/proc"
)

// fileKey and tableEntry cache a file's table in an Unwinder: by the
// file opened (device, inode, size and time of change), and by build ID.
type fileKey struct {
	dev, ino    uint64
	size, mtime int64
}

type tableEntry struct {
	once sync.Once
	t    *table
	err  error
}

// table returns m's file's table, opened once per file (Unwinder.byFile,
// byID). The file is opened through proc.Open: never blocking, only a
// regular file, a path under /proc/PID/root resolved inside that root. A
// file that could not be opened is not remembered.
func (u *Unwinder) table(m *proc.Mapping) (*table, error) {
	f, err := proc.Open(m.Path, nil)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat %s: %w", m.Path, err)
	}
	key := fileKey{st.Dev, st.Ino, st.Size, st.Mtim.Nano()}
	u.mu.Lock()
	e := u.byFile[key]
	if e == nil {
		if m.BuildID != "" {
			e = u.byID[m.BuildID]
		}
		if e == nil {
			e = &tableEntry{}
			if m.BuildID != "" {
				u.byID[m.BuildID] = e
			}
		}
		u.byFile[key] = e
	}
	u.mu.Unlock()
	used := false
	e.once.Do(func() { e.t, e.err = openTable(f, m.Path); used = true })
	if !used {
		f.Close()
	}
	return e.t, e.err
}

// table is one ELF file's call-frame information, opened once per file
// and read entry by entry as addresses ask for it. With .eh_frame_hdr (every
// file linked by GNU ld, gold, lld or mold) finding the FDE of an address is
// a binary search of that sorted table; only files without it get a full
// scan of .eh_frame, once.
type table struct {
	f     *os.File
	arch  *arch
	loads []load

	eh, debug *section
	hdr       []byte // .eh_frame_hdr's search table: int32 pairs relative to hdrAddr
	hdrAddr   uint64

	mu      sync.Mutex
	cies    map[uint64]*cie
	index   map[*section][]indexEntry // built by scan, for sections without a search table
	rows    map[uint64]*rowResult     // by file virtual address: stacks repeat
	scanErr map[*section]error
}

type load struct {
	off, filesz, vaddr uint64
	exec               bool
}

type indexEntry struct {
	begin, end, off uint64
}

type rowResult struct {
	row row
	err error
}

const maxRows = 1 << 16 // cached rows per file; beyond it, rows are recomputed

// openTable reads the open file f, at path; the table keeps f, which is
// closed here where there is no table.
func openTable(f *os.File, path string) (*table, error) {
	ef, err := elf.NewFile(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	a := archOf(ef.Machine)
	if a == nil {
		f.Close()
		return nil, fmt.Errorf("%s: %v: only x86-64 and arm64 are unwound", path, ef.Machine)
	}
	t := &table{f: f, arch: a, cies: map[uint64]*cie{}, index: map[*section][]indexEntry{},
		rows: map[uint64]*rowResult{}, scanErr: map[*section]error{}}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			t.loads = append(t.loads, load{off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr, exec: p.Flags&elf.PF_X != 0})
		}
	}
	if s := ef.Section(".eh_frame"); s != nil && s.Type == elf.SHT_PROGBITS && s.Flags&elf.SHF_COMPRESSED == 0 {
		t.eh = &section{r: s, size: s.Size, addr: s.Addr, arch: a}
	}
	if s := ef.Section(".debug_frame"); s != nil && s.Type == elf.SHT_PROGBITS {
		// Read whole: it may be compressed, and only files that lack
		// .eh_frame for an address get here.
		if data, err := s.Data(); err == nil {
			t.debug = &section{r: bytes.NewReader(data), size: uint64(len(data)), debug: true, arch: a}
		}
	}
	if s := ef.Section(".eh_frame_hdr"); s != nil && t.eh != nil && s.Type == elf.SHT_PROGBITS {
		if data, err := s.Data(); err == nil {
			t.hdr, t.hdrAddr = searchTable(data, s.Addr)
		}
	}
	if t.eh == nil && t.debug == nil {
		f.Close()
		return nil, fmt.Errorf("%s: no .eh_frame or .debug_frame", path)
	}
	return t, nil
}

// searchTable returns .eh_frame_hdr's sorted (initial location, FDE)
// table when it has the one encoding linkers write (datarel sdata4).
func searchTable(data []byte, addr uint64) ([]byte, uint64) {
	r := &buf{b: data}
	if r.u8() != 1 {
		return nil, 0
	}
	ptrEnc, countEnc, tableEnc := r.u8(), r.u8(), r.u8()
	r.ptr(ptrEnc, addr+uint64(r.off), addr)
	count := r.ptr(countEnc, addr+uint64(r.off), addr)
	if r.err != nil || tableEnc != peDataRel|peSdata4 || count > uint64(len(data)-r.off)/8 {
		return nil, 0
	}
	return data[r.off : r.off+int(count)*8], addr
}

func (t *table) Close() error { return t.f.Close() }

// vaddr converts a file offset to the virtual address the file's headers
// give it, preferring an executable segment.
func (t *table) vaddr(off uint64) (uint64, bool) {
	found, ok := uint64(0), false
	for _, l := range t.loads {
		if off < l.off || off-l.off >= l.filesz {
			continue
		}
		v := off - l.off + l.vaddr
		if l.exec {
			return v, true
		}
		if !ok {
			found, ok = v, true
		}
	}
	return found, ok
}

var errNoFDE = errors.New("no call-frame information")

// rowFor returns the unwinding row at file virtual address pc.
func (t *table) rowFor(pc uint64) (*row, error) {
	// No defer: this runs for every frame of every record, and the cached
	// row is the common case. The map holds pointers: a row is 136 bytes,
	// and a map of them inline looked up and copied out slower. A cached
	// row is never written again, so readers share it.
	t.mu.Lock()
	if r, ok := t.rows[pc]; ok {
		t.mu.Unlock()
		return &r.row, r.err
	}
	r := t.rowUncached(pc)
	t.mu.Unlock()
	return &r.row, r.err
}

// rowUncached finds pc's row in the tables and caches it; t.mu is held.
func (t *table) rowUncached(pc uint64) *rowResult {
	f, err := t.fdeFor(pc)
	r := &rowResult{err: err}
	if err == nil {
		r.row, r.err = rowAt(f, pc)
	}
	if len(t.rows) < maxRows {
		t.rows[pc] = r
	}
	return r
}

func (t *table) fdeFor(pc uint64) (*fde, error) {
	if t.eh != nil {
		var f *fde
		var err error
		if t.hdr != nil {
			f, err = t.searchHdr(pc)
		} else {
			f, err = t.searchIndex(t.eh, pc)
		}
		if err == nil || !errors.Is(err, errNoFDE) {
			return f, err
		}
	}
	if t.debug != nil {
		return t.searchIndex(t.debug, pc)
	}
	return nil, errNoFDE
}

func (t *table) searchHdr(pc uint64) (*fde, error) {
	n := len(t.hdr) / 8
	le := binary.LittleEndian
	at := func(i int) uint64 { return t.hdrAddr + uint64(int64(int32(le.Uint32(t.hdr[8*i:])))) }
	i := sort.Search(n, func(i int) bool { return at(i) > pc }) - 1
	if i < 0 {
		return nil, errNoFDE
	}
	fdeAddr := t.hdrAddr + uint64(int64(int32(le.Uint32(t.hdr[8*i+4:]))))
	f, err := t.fdeAt(t.eh, fdeAddr-t.eh.addr)
	if err != nil {
		return nil, err
	}
	if pc < f.begin || pc >= f.end {
		return nil, errNoFDE
	}
	return f, nil
}

func (t *table) searchIndex(s *section, pc uint64) (*fde, error) {
	idx, err := t.scan(s)
	if err != nil && len(idx) == 0 {
		return nil, err
	}
	i := sort.Search(len(idx), func(i int) bool { return idx[i].begin > pc }) - 1
	if i < 0 || pc >= idx[i].end {
		return nil, errNoFDE
	}
	return t.fdeAt(s, idx[i].off)
}

// scan indexes every FDE of s by the addresses it covers, once.
func (t *table) scan(s *section) ([]indexEntry, error) {
	if idx, ok := t.index[s]; ok {
		return idx, t.scanErr[s]
	}
	var idx []indexEntry
	var err error
	for off := uint64(0); off < s.size; {
		body, bodyOff, next, e := s.entry(off)
		if e != nil {
			err = e
			break
		}
		if body != nil {
			if isCIE, _ := s.isCIE(body, bodyOff); !isCIE {
				if f, e := t.fdeAt(s, off); e == nil && f.end > f.begin {
					idx = append(idx, indexEntry{f.begin, f.end, off})
				}
			}
		}
		off = next
	}
	sort.Slice(idx, func(i, j int) bool { return idx[i].begin < idx[j].begin })
	t.index[s], t.scanErr[s] = idx, err
	return idx, err
}

func (t *table) fdeAt(s *section, off uint64) (*fde, error) {
	body, bodyOff, _, err := s.entry(off)
	if err != nil {
		return nil, err
	}
	isCIE, cieOff := s.isCIE(body, bodyOff)
	if body == nil || isCIE {
		return nil, fmt.Errorf("FDE at %#x: %w", off, errBad)
	}
	c, err := t.cieAt(s, cieOff)
	if err != nil {
		return nil, err
	}
	return s.parseFDE(body, bodyOff, c)
}

func (t *table) cieAt(s *section, off uint64) (*cie, error) {
	key := off
	if s.debug {
		key |= 1 << 63
	}
	if c, ok := t.cies[key]; ok {
		return c, nil
	}
	body, bodyOff, _, err := s.entry(off)
	if err != nil {
		return nil, err
	}
	if isCIE, _ := s.isCIE(body, bodyOff); !isCIE {
		return nil, fmt.Errorf("CIE at %#x: %w", off, errBad)
	}
	c, err := s.parseCIE(body)
	if err != nil {
		return nil, err
	}
	t.cies[key] = c
	return c, nil
}
