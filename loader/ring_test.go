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
