package unwind

import (
	"math/rand/v2"
	"sort"
	"testing"
)

// TestRowIndex: the index finds, for every address, the row a search of
// all the rows finds, on made-up files of rows close together, far
// apart, and of one row; and it is never longer than IndexLen.
func TestRowIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		n   int
		gap uint32
	}{{1, 0}, {2, 1}, {3, 1 << 20}, {100, 4}, {1000, 64}, {5000, 1 << 12}, {50, 1 << 26}} {
		var c Compact
		pc := uint32(0x1000 + rng.IntN(4096))
		for range tc.n {
			c.Rows = append(c.Rows, CompactRow{PC: pc, CFAOff: int32(len(c.Rows))})
			pc += 1 + uint32(rng.Uint64N(uint64(2*tc.gap+1)))
		}
		x := c.Index()
		if len(x.Start) > IndexLen(len(c.Rows)) {
			t.Fatalf("%d rows: index of %d", len(c.Rows), len(x.Start))
		}
		last := uint64(c.Rows[len(c.Rows)-1].PC)
		check := func(v uint64) {
			want := sort.Search(len(c.Rows), func(i int) bool { return uint64(c.Rows[i].PC) > v }) - 1
			got, ok := x.Find(c.Rows, v)
			if want < 0 || v>>32 != 0 { // BPF's addresses are 32-bit file offsets
				if ok {
					t.Fatalf("%d rows, %#x: row %d, want none", tc.n, v, got)
				}
				return
			}
			if !ok || got != want {
				t.Fatalf("%d rows, %#x: row %d (%v), want %d", tc.n, v, got, ok, want)
			}
		}
		for _, r := range c.Rows {
			for _, d := range []int64{-1, 0, 1} {
				check(uint64(int64(r.PC) + d))
			}
		}
		for range 20000 {
			check(uint64(c.Rows[0].PC) - 64 + rng.Uint64N(last-uint64(c.Rows[0].PC)+128))
		}
		check(1 << 32)
		t.Logf("%d rows: shift %d, %d index entries", tc.n, x.Shift, len(x.Start))
	}
}
