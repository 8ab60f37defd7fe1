package units

import (
	"math"
	"testing"
)

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{512, "512 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{10*1024 - 1, "10.0 KiB"},
		{1<<20 - 1, "1.0 MiB"}, // not "1024.0 KiB"
		{1<<20 - 52, "1023.9 KiB"},
		{1 << 20, "1.0 MiB"},
		{3 << 19, "1.5 MiB"},
		{910163968, "868.0 MiB"},
		{1 << 30, "1.0 GiB"},
		{6278873088, "5.8 GiB"},
		{1 << 40, "1.0 TiB"},
		{1 << 50, "1.0 PiB"},
		{1 << 60, "1.0 EiB"},
		{math.MaxUint64, "16.0 EiB"},
	} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}

func TestSignedBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 512: "+512 B", -512: "-512 B", 3 << 19: "+1.5 MiB", -(3 << 19): "-1.5 MiB"} {
		if got := SignedBytes(n); got != want {
			t.Errorf("SignedBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
