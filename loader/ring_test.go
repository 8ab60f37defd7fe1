package loader

import (
	"strings"
	"testing"
)

// The default allocation record is 18 024 bytes as BPF reserves it
// (header, 127 frame slots, registers, a 16 KiB window, the Python block),
// 18 032 in the ring; a ring must hold eight of them.
func TestCheckRing(t *testing.T) {
	if got := RecordBytes(DefaultStackWindow); got != 18024+8 {
		t.Errorf("RecordBytes(16 KiB) = %d, want %d", got, 18024+8)
	}
	if got := RecordBytes(-1); got != 1088+520+8 {
		t.Errorf("RecordBytes(none) = %d, want %d", got, 1088+520+8)
	}
	for _, c := range []struct {
		ring   uint32
		window int
		ok     bool
	}{
		{4 << 10, DefaultStackWindow, false},
		{64 << 10, DefaultStackWindow, false},
		{128 << 10, DefaultStackWindow, false}, // 7 records
		{256 << 10, DefaultStackWindow, true},
		{16 << 10, -1, true},
		{8 << 10, -1, false},
		{512 << 10, MaxStackWindow, false},
		{1 << 20, MaxStackWindow, true},
		{DefaultRingBytes, DefaultStackWindow, true},
	} {
		err := CheckRing(c.ring, c.window)
		if (err == nil) != c.ok {
			t.Errorf("CheckRing(%d, %d) = %v, want ok %v", c.ring, c.window, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "18032 bytes") && c.window == DefaultStackWindow {
			t.Errorf("CheckRing(%d, %d) = %q: does not give the record's size", c.ring, c.window, err)
		}
	}
}

// The default ring is 64 MiB (bursts of records of frames) whatever the
// stack window, and holds at least as many allocation records with
// windows for every stack window as 16 MiB does with the default one
// (some 930).
func TestDefaultRing(t *testing.T) {
	for _, w := range []int{0, -1, 4 << 10, 16 << 10, 20 << 10, 32 << 10, 48 << 10, 64 << 10} {
		o := Options{StackWindow: w}
		o.defaults()
		if o.RingBytes != 64<<20 {
			t.Errorf("Options{StackWindow: %d} defaults to a ring of %d, want 64 MiB", w, o.RingBytes)
		}
	}
	base := uint32(16<<20) / RecordBytes(DefaultStackWindow)
	for w := 4096; w <= MaxStackWindow; w += 4096 {
		if n := uint32(DefaultRingBytes) / RecordBytes(w); n < base {
			t.Errorf("the default ring holds %d records of %d bytes (window %d), the default window's %d", n, RecordBytes(w), w, base)
		}
	}
	o := Options{StackWindow: MaxStackWindow}
	o.defaults()
	if o.RingBytes != 64<<20 || o.WakeupBytes != 8<<20 {
		t.Errorf("Options{StackWindow: 64 KiB} defaults to a ring of %d, wakeup %d; want 64 MiB, 8 MiB", o.RingBytes, o.WakeupBytes)
	}
}

// The warning for a full ring names the ring's size and one four times it,
// in --ring-size's own words; at the largest ring, only a smaller window.
func TestLossHint(t *testing.T) {
	c := map[string]uint64{"ringbuf_full": 562, "no_entry": 2, "stale_entry": 1}
	want := "562 with the ring buffer (16MiB) full: raise --ring-size, e.g. --ring-size 64MiB " +
		"(each allocation record holds its stack window: a smaller --stack-window fits more); " +
		"3 calls whose entry was missed (in progress when the probes attached)"
	if got := LossHint(c, 16<<20, true); got != want {
		t.Errorf("LossHint(16 MiB) =\n%q, want\n%q", got, want)
	}
	for ring, want := range map[uint32]string{
		256 << 10: "(256KiB) full: raise --ring-size, e.g. --ring-size 1MiB ",
		512 << 20: "(512MiB) full: raise --ring-size, e.g. --ring-size 1GiB ",
		1 << 30:   "(1GiB, the largest) full: a smaller --stack-window fits more records",
	} {
		if got := LossHint(map[string]uint64{"ringbuf_full": 1}, ring, true); !strings.Contains(got, want) {
			t.Errorf("LossHint(%d) = %q, want it to say %q", ring, got, want)
		}
	}
	// A reader at the job's priority (no CAP_SYS_NICE): that remedy first.
	got := LossHint(map[string]uint64{"ringbuf_full": 7}, 64<<20, false)
	if want := "7 with the ring buffer (64MiB) full while the reader ran at the job's priority: give cudatrace CAP_SYS_NICE " +
		"(its reader then runs at nice -10, ahead of busy threads), or raise --ring-size, e.g. --ring-size 256MiB"; got != want {
		t.Errorf("LossHint(not raised) =\n%q, want\n%q", got, want)
	}
	if got := LossHint(map[string]uint64{"nested": 5}, DefaultRingBytes, true); got != "" {
		t.Errorf("LossHint(no loss) = %q, want none", got)
	}
}

// TestNoWindowHint: what records kept without their windows mean, and the
// ring to try instead (none past the largest).
func TestNoWindowHint(t *testing.T) {
	want := "3 allocations were recorded without their stack windows (the reader was behind by more than half the ring buffer, 16MiB, in a burst): " +
		"each is in every figure, its native frames from frame pointers alone (shallower where code has none); raise --ring-size, e.g. --ring-size 64MiB"
	if got := NoWindowHint(3, 16<<20); got != want {
		t.Errorf("NoWindowHint(3, 16 MiB) =\n%q, want\n%q", got, want)
	}
	if got := NoWindowHint(1, MaxRingBytes); !strings.HasSuffix(got, "; a smaller --stack-window fits more") {
		t.Errorf("NoWindowHint(1, the largest ring) = %q, want a smaller window as the remedy", got)
	}
}
