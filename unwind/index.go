package unwind

// RowIndex narrows the search for an address's row (bpf/unwind.h
// ct_uw_step) from all of a file's rows to the few of one bucket: the
// file's addresses from its first row's on, cut into buckets of
// 1<<Shift bytes, each with the row that holds at its start. The row of
// an address in bucket b is one of rows Start[b] to Start[b+1]: one or
// two on average, where a search of the whole file's took some 15 steps
// for the C library's 28000 rows (docs/benchmarks.md, 2026-11-29). The
// OpenTelemetry eBPF profiler's stack delta pages do the same with
// 64 KiB pages in a hash map; here a bucket's size is the file's own
// (the smallest power of two, 16 bytes at least, that gives no more
// buckets than rows), so that the index, an array beside the rows, is at
// most the rows' count plus two (IndexLen) and room for the rows is room
// for the index.
type RowIndex struct {
	Base  uint32   // the first row's PC: the first bucket's start
	Shift uint8    // a bucket is 1<<Shift bytes
	Start []uint32 // per bucket, the row holding at its start; one more, the last row
}

// minIndexShift is the smallest bucket, 16 bytes: a few instructions.
const minIndexShift = 4

// IndexLen is the most entries a file of n rows has in its RowIndex.
func IndexLen(n int) int { return n + 2 }

// Index makes the rows' index; none (no Start) where there are no rows.
func (c *Compact) Index() RowIndex {
	rows := c.Rows
	if len(rows) == 0 {
		return RowIndex{}
	}
	x := RowIndex{Base: rows[0].PC, Shift: minIndexShift}
	span := uint64(rows[len(rows)-1].PC - x.Base)
	for span>>x.Shift > uint64(len(rows)) {
		x.Shift++
	}
	buckets := int(span>>x.Shift) + 1
	x.Start = make([]uint32, buckets+1)
	r := 0
	for b := range buckets {
		at := uint64(x.Base) + uint64(b)<<x.Shift
		for r+1 < len(rows) && uint64(rows[r+1].PC) <= at {
			r++
		}
		x.Start[b] = uint32(r)
	}
	x.Start[buckets] = uint32(len(rows) - 1)
	return x
}

// Find is the index of the row at or below file virtual address v, as
// ct_uw_step finds it, and whether there is one (none below the first).
func (x RowIndex) Find(rows []CompactRow, v uint64) (int, bool) {
	if len(x.Start) == 0 || v>>32 != 0 || uint32(v) < x.Base {
		return 0, false
	}
	b := uint64(uint32(v)-x.Base) >> x.Shift
	if b >= uint64(len(x.Start)-1) {
		return len(rows) - 1, true
	}
	// The first row above v among Start[b]+1 .. Start[b+1]; the one
	// before it holds.
	lo, hi := int(x.Start[b])+1, int(x.Start[b+1])+1
	for lo < hi {
		mid := lo + (hi-lo)/2
		if uint64(rows[mid].PC) <= v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1, true
}
