package unwind

import (
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// An unwind answered from the memo is the unwind itself: every variant of
// the chain's record (each word of its window changed in turn, the window
// cut, rbp and the stack pointer moved) unwinds through a Maps that has
// seen the others exactly as a fresh unwind without the memo does, and the
// memo answers those that differ from the record only where no unwind
// looks.
func TestUnwindMemo(t *testing.T) {
	d := runDump(t, chain(t, t.TempDir()))
	u := New()
	defer u.Close()
	maps, ref := NewMaps(d.maps), NewMaps(d.maps)
	want, wantStop := u.unwind(ref, d.regs, d.window, false, nil, nil, nil)
	if wantStop.Kind != StopEnd || len(want) < 6 {
		t.Fatalf("the chain unwinds to %x, %q", want, wantStop)
	}
	got, stop := u.Unwind(maps, d.regs, d.window, false, nil)
	got2, stop2 := u.Unwind(maps, d.regs, d.window, false, nil)
	if !slices.Equal(got, want) || !slices.Equal(got2, want) || stop.String() != wantStop.String() || stop2.String() != wantStop.String() {
		t.Fatalf("unwound %x (%q), then %x (%q); want %x (%q)", got, stop, got2, stop2, want, wantStop)
	}
	if maps.memoHits != 1 {
		t.Fatalf("%d unwinds answered by the memo, want the second", maps.memoHits)
	}
	// What the memo holds of it: the return addresses (and rbp only where
	// a rule needed it), not the window.
	e := maps.memoFor(d.regs)
	t.Logf("%d frames from %d words of a %d-byte window", len(want), len(e.reads), len(d.window))
	if len(e.reads) < len(want)-1 || len(e.reads) > 2*len(want) {
		t.Errorf("the unwind read %d words for %d frames", len(e.reads), len(want))
	}

	check := func(what string, regs events.Regs, w []byte) bool {
		t.Helper()
		before := maps.memoHits
		got, stop := u.Unwind(maps, regs, w, false, nil)
		want, wantStop := u.unwind(ref, regs, w, false, nil, nil, nil)
		if !slices.Equal(got, want) || stop.Kind != wantStop.Kind || stop.String() != wantStop.String() {
			t.Errorf("%s: memo %x (%q), unwind %x (%q)", what, got, stop, want, wantStop)
		}
		return maps.memoHits > before
	}
	hits, changed := 0, 0
	w := slices.Clone(d.window)
	for off := 0; off+8 <= len(w); off += 8 {
		old := binary.LittleEndian.Uint64(w[off:])
		binary.LittleEndian.PutUint64(w[off:], old^0x5a5a5a5a5a5a5a5a)
		if check(fmt.Sprintf("word at +%#x changed", off), d.regs, w) {
			hits++
		}
		binary.LittleEndian.PutUint64(w[off:], old)
		// back to the record: the memo holds the changed one now
		if !check("the record again", d.regs, w) {
			changed++
		}
	}
	words := len(w) / 8
	if hits != words-len(e.reads) || changed != len(e.reads) {
		t.Errorf("of %d words changed, %d answered by the memo and %d not; want %d and %d (the words an unwind reads)",
			words, hits, changed, words-len(e.reads), len(e.reads))
	}
	for _, n := range []int{len(w) - 8, len(w) / 2, 64} {
		check(fmt.Sprintf("window cut to %d bytes", n), d.regs, w[:n])
	}
	r := d.regs
	r.BP ^= 0xfff0
	if check("rbp moved", r, w) && maps.memoFor(r).usedBP {
		t.Errorf("rbp moved: answered by the memo, whose unwind used rbp")
	}
	r = d.regs
	r.SP += 8
	check("the stack pointer moved", r, w[8:])
}
