package unwind

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// lookup is the row BPF finds for file virtual address v (bpf/unwind.h:
// the last at or below it, through the file's RowIndex), and whether
// there is one. It checks the index's answer against a search of all
// the rows.
func (c *Compact) lookup(v uint64) (CompactRow, bool) {
	i := sort.Search(len(c.Rows), func(i int) bool { return uint64(c.Rows[i].PC) > v }) - 1
	x, _ := indexes.Load(c)
	if x == nil {
		x, _ = indexes.LoadOrStore(c, c.Index())
	}
	j, ok := x.(RowIndex).Find(c.Rows, v)
	if i < 0 || v>>32 != 0 {
		if ok {
			panic(fmt.Sprintf("%#x: the index finds row %d, below the first", v, j))
		}
		return CompactRow{}, false
	}
	if !ok || j != i {
		panic(fmt.Sprintf("%#x: the index finds row %d (%v), the search %d", v, j, ok, i))
	}
	return c.Rows[i], true
}

// indexes holds each Compact's RowIndex for lookup.
var indexes sync.Map

// compactFiles reduces the files of maps' executable mappings.
func compactFiles(t testing.TB, maps []proc.Mapping) map[string]*Compact {
	t.Helper()
	out := map[string]*Compact{}
	for _, m := range maps {
		if !m.Exec() || !m.File() || out[m.Path] != nil {
			continue
		}
		f, err := os.Open(m.Path)
		if err != nil {
			continue // another host's file (the arm64 dumps' libc)
		}
		c, err := CompactFile(context.Background(), f, m.Path)
		if err != nil {
			t.Logf("%s: %v", m.Path, err)
			continue
		}
		out[m.Path] = c
	}
	return out
}

// Outcomes of bpfUnwind, as ct_uw_step's.
const (
	simEnd = iota
	simMax
	simNoMap
	simRule
)

// bpfUnwind is bpf/unwind.h's uw_stack in Go, step for step, on the rows
// of files and the window as the process's memory: what BPF finds for a
// record.
func bpfUnwind(files map[string]*Compact, maps []proc.Mapping, regs events.Regs, window []byte, entry bool, raMask uint64) ([]uint64, int) {
	type pmap struct {
		CompactMapping
		c *Compact
	}
	var pm []pmap
	for _, m := range maps {
		if c := files[m.Path]; c != nil && m.Exec() && m.File() {
			for _, cm := range c.Mappings(m) {
				pm = append(pm, pmap{cm, c})
			}
		}
	}
	sort.Slice(pm, func(i, j int) bool { return pm[i].Start < pm[j].Start })
	read := func(addr uint64) (uint64, bool) {
		if addr < regs.SP || addr-regs.SP+8 > uint64(len(window)) {
			return 0, false
		}
		return binary.LittleEndian.Uint64(window[addr-regs.SP:]), true
	}
	pc, sp, fp, lr := regs.IP, regs.SP, regs.BP, uint64(0)
	fpOK, lrOK := true, false
	back := uint64(1)
	if entry {
		back = 0
		lr, lrOK = regs.LR, regs.LR != 0
	}
	pcs := []uint64{pc}
	for len(pcs) < MaxFrames {
		i := sort.Search(len(pm), func(i int) bool { return pm[i].Start > pc }) - 1
		if i < 0 || pc >= pm[i].End {
			return pcs, simNoMap
		}
		r, ok := pm[i].c.lookup(pc - pm[i].Bias - back)
		if !ok {
			return pcs, simNoMap
		}
		var cfa uint64
		switch r.CFA {
		case CFASP:
			cfa = sp + uint64(int64(r.CFAOff))
		case CFAFP:
			if !fpOK {
				return pcs, simRule
			}
			cfa = fp + uint64(int64(r.CFAOff))
		default:
			return pcs, simRule
		}
		if r.RA == RegUndef {
			return pcs, simEnd
		}
		var ra uint64
		nfp, nfpOK, fpRead := fp, fpOK, false
		switch r.RA {
		case RegOffset:
			if r.FP == RegOffset && r.FPOff+8 == r.RAOff {
				a, ok1 := read(cfa + uint64(int64(r.FPOff)))
				b, ok2 := read(cfa + uint64(int64(r.RAOff)))
				if !ok1 || !ok2 {
					return pcs, simRule
				}
				nfp, ra, nfpOK, fpRead = a, b, true, true
			} else if ra, ok = read(cfa + uint64(int64(r.RAOff))); !ok {
				return pcs, simRule
			}
		case RegLR:
			if !lrOK {
				return pcs, simRule
			}
			ra = lr
		default:
			return pcs, simRule
		}
		ra &= raMask
		if ra == 0 {
			return pcs, simEnd
		}
		if cfa < sp || cfa == sp && r.RA != RegLR {
			return pcs, simRule
		}
		switch r.FP {
		case RegUndef:
			nfpOK = false
		case RegOffset:
			if !fpRead {
				nfp, nfpOK = read(cfa + uint64(int64(r.FPOff)))
			}
		}
		pc, sp, fp, fpOK, lrOK, back = ra, cfa, nfp, nfpOK, false, 1
		pcs = append(pcs, pc)
	}
	return pcs, simMax
}

// TestCompactRows: the row BPF finds for an address is the rule the
// unwinder runs the FDE's instructions to there, reduced (or CFANone where
// it cannot be), at every byte of the chain's libraries and executable,
// and at every 61st of the C library's code.
func TestCompactRows(t *testing.T) {
	d := runDump(t, chain(t, t.TempDir()))
	checked := 0
	for path := range compactFiles(t, d.maps) {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		tab, err := openTable(f, path)
		if err != nil {
			t.Fatal(err)
		}
		f2, _ := os.Open(path)
		c, err := CompactFile(context.Background(), f2, path)
		if err != nil {
			t.Fatal(err)
		}
		stride := uint64(1)
		if filepath.Dir(path) != filepath.Dir(d.maps[0].Path) {
			stride = 61
		}
		for _, l := range tab.loads {
			if !l.exec {
				continue
			}
			for v := l.vaddr; v < l.vaddr+l.filesz; v += stride {
				got, ok := c.lookup(v)
				var want CompactRow
				if w, err := tab.rowFor(v); err == nil {
					want = compactOf(tab.arch, w)
				}
				want.PC, got.PC = 0, 0
				if !ok {
					got = CompactRow{}
				}
				if got != want {
					t.Fatalf("%s+%#x: row %+v, want %+v", path, v, got, want)
				}
				checked++
			}
		}
		tab.Close()
	}
	t.Logf("%d addresses checked", checked)
}

// TestCompactUnwindsAsUnwind: what BPF unwinds from the rows (bpfUnwind)
// is the unwinder's stack frame for frame, through the chain of code
// without frame pointers down to the C library's start; where it falls
// back (main realigning its stack: a DWARF expression), the window is
// unwound here instead. arm64's chains with signed return addresses too.
func TestCompactUnwindsAsUnwind(t *testing.T) {
	type tcase struct {
		name  string
		d     dump
		entry bool
		mask  uint64
		want  int // simEnd, or the fallback expected
	}
	cases := []tcase{
		{"x86-64", runDump(t, chain(t, t.TempDir())), true, ^uint64(0), simEnd},
		{"x86-64 debug_frame", runDump(t, chain(t, t.TempDir(), "-fno-asynchronous-unwind-tables", "-fno-unwind-tables")), true, ^uint64(0), simEnd},
		{"x86-64 stackrealign", runDump(t, chain(t, t.TempDir(), "-mstackrealign")), true, ^uint64(0), simEnd},
	}
	for _, series := range []string{"6.1", "6.12"} {
		d := armDump(t, series)
		cases = append(cases, tcase{"arm64 " + series, d, true, NewMaps(d.maps).vaMask, simNoMap})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			files := compactFiles(t, c.d.maps)
			got, how := bpfUnwind(files, c.d.maps, c.d.regs, c.d.window, c.entry, c.mask)
			u := New()
			defer u.Close()
			want, stop := u.Unwind(NewMaps(c.d.maps), c.d.regs, c.d.window, !c.entry, nil)
			t.Logf("BPF: %x (%d); unwind: %x (%s)", got, how, want, stop)
			if how != c.want {
				t.Errorf("BPF unwind ended with %d, want %d", how, c.want)
			}
			switch how {
			case simEnd, simMax:
				if stop.Kind != StopEnd && stop.Kind != StopMax || !slices.Equal(got, want) {
					t.Errorf("BPF unwound %x, the unwinder %x (%s)", got, want, stop)
				}
			default:
				// Falls back: every frame BPF had is the unwinder's.
				if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
					t.Errorf("BPF's frames before it fell back %x are not the unwinder's %x", got, want)
				}
			}
			if len(got) < 4 {
				t.Errorf("BPF unwound %d frames", len(got))
			}
		})
	}
	_ = fmt.Sprint
}
