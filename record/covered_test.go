package record

import (
	"testing"

	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
)

// mapsAt is a capture of process 42 with one executable file mapping a
// range [start, end) each.
func mapsAt(ranges ...[2]uint64) *procmodel.Capture {
	c := &procmodel.Capture{PID: 42}
	for _, r := range ranges {
		c.Maps = append(c.Maps, proc.Mapping{Start: r[0], End: r[1], Perms: "r-xp", Path: "/lib/x.so"})
	}
	return c
}

// covered answers from the stacks it remembers only while the capture they
// were checked against is current: a capture that maps what was missing,
// or no longer maps what was there, is searched again.
func TestCoveredFollowsCapture(t *testing.T) {
	s := newState(Options{}, &Result{})
	defer s.close()
	lp := &liveProc{p: s.procs.Add(mapsAt([2]uint64{0x1000, 0x2000}))}
	const stray = 0x7ffd0000
	unwound := []uint64{0x1100, 0x1200, 0x1300}
	steps := []struct {
		what  string
		cap   *procmodel.Capture // made current first, when set
		stack []uint64
		want  bool
	}{
		{"CPython's stray address", nil, []uint64{0x1100, stray}, false},
		{"the same again", nil, []uint64{0x1100, stray}, false},
		{"an unwound stack", nil, unwound, true},
		{"a free's record", nil, nil, true},
		{"the same again", nil, unwound, true},
		{"one frame more, outside", nil, append(unwound[:3:3], 0x3000), false},
		{"the stray address again", nil, []uint64{0x1100, stray}, false},
		{"a library mapped at the stray address", mapsAt([2]uint64{0x1000, 0x2000}, [2]uint64{stray, stray + 0x10000}),
			[]uint64{0x1100, stray}, true},
		{"the unwound stack", nil, unwound, true},
		{"the first library gone", mapsAt([2]uint64{stray, stray + 0x10000}), unwound, false},
		{"the stray address, mapped still", nil, []uint64{stray + 0x10}, true},
	}
	for _, st := range steps {
		if st.cap != nil {
			lp.p = s.procs.Add(st.cap)
		}
		if got := lp.covered(st.stack); got != st.want {
			t.Errorf("%s: covered %x = %v, want %v", st.what, st.stack, got, st.want)
		}
	}
}

// BenchmarkCoveredPython is what checking a CPython process's stacks
// against its capture costs for one allocation and its free, as the live
// reader makes them: the frame-pointer stack (with a stray address), the
// 40 frames unwound from the window (checked again after the unwind), and
// the free's empty stack, against 80 executable mappings.
func BenchmarkCoveredPython(b *testing.B) {
	var ranges [][2]uint64
	for i := range 80 {
		start := uint64(0x7f0000000000 + i*0x100000)
		ranges = append(ranges, [2]uint64{start, start + 0x80000})
	}
	s := newState(Options{}, &Result{})
	defer s.close()
	lp := &liveProc{p: s.procs.Add(mapsAt(ranges...))}
	fp := []uint64{ranges[3][0] + 0x6f7a, 0x7ffd46081440}
	var unwound []uint64
	for i := range 40 {
		unwound = append(unwound, ranges[(i*7)%80][0]+uint64(0x100+i))
	}
	for b.Loop() {
		if lp.covered(fp) || !lp.covered(unwound) || !lp.covered(nil) {
			b.Fatal("wrong answer")
		}
	}
}
