package replay

import (
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// Each interpreter-loop frame of the native stack, innermost first, gives
// way to one run of Python frames; runs left over go at the outer end.
func TestMergePython(t *testing.T) {
	eval := [][2]uint64{{0x5000, 0x6000}, {0x9000, 0x9100}} // the loop and its .cold part
	py := []events.PyFrame{
		{Code: 1}, {Code: 2, Flags: events.PyEntry}, // the innermost C call's run
		{Code: 3, Flags: events.PyEntry},
		{Code: 4}, {Code: 5}, // the last run, never flagged (cut short)
	}
	addr := func(f events.PyFrame) uint64 { return 0xf00 + f.Code }
	native := []uint64{0x1000, 0x5010, 0x2000, 0x9050, 0x3000}
	got := MergePython(native, py, eval, addr)
	want := []uint64{0x1000, 0xf01, 0xf02, 0x2000, 0xf03, 0x3000, 0xf04, 0xf05}
	if !slices.Equal(got, want) {
		t.Fatalf("merged %x, want %x", got, want)
	}
	// More loop frames than runs: the extra ones stay native.
	got = MergePython([]uint64{0x5010, 0x5020}, py[:2], eval, addr)
	if want := []uint64{0xf01, 0xf02, 0x5020}; !slices.Equal(got, want) {
		t.Fatalf("merged %x, want %x", got, want)
	}
}
