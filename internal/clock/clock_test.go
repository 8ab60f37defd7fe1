package clock

import (
	"testing"
	"time"
)

// The pair is read between the readings around it, and its boot reading
// lies within its own width of them.
func TestPair(t *testing.T) {
	w0, b0 := time.Now(), Boot()
	wall, boot, width := Pair()
	b1, w1 := Boot(), time.Now()
	if wall.Before(w0) || wall.After(w1) {
		t.Errorf("wall %v not between %v and %v", wall, w0, w1)
	}
	if boot < b0 || boot > b1 || boot-width/2 < b0 || boot+width/2 > b1 {
		t.Errorf("boot %d ± %d not within [%d, %d]", boot, width/2, b0, b1)
	}
	if width == 0 || width > uint64(b1-b0) {
		t.Errorf("width %d, want within the %d ns the call took", width, b1-b0)
	}
}

func TestReadSync(t *testing.T) {
	s, ok := ReadSync()
	if !ok {
		t.Skip("adjtimex: not available here")
	}
	// The kernel's maximum error is never below its estimate.
	if s.MaxError < s.EstError {
		t.Errorf("%+v: max error below the estimated", s)
	}
}
