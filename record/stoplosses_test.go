package record

import (
	"errors"
	"testing"
)

func TestStopMark(t *testing.T) {
	now := map[string]uint64{"ringbuf_full": 5, "no_entry": 1, "events": 100}
	m := stopMark{read: func() (map[string]uint64, error) { return now, nil }}
	if n := m.stopping(map[string]uint64{"ringbuf_full": 7}); n != 0 {
		t.Errorf("before the stop: %d lost while stopping, want 0", n)
	}
	m.mark()
	now = map[string]uint64{"ringbuf_full": 50} // a second mark reads nothing
	m.mark()
	if n := m.stopping(map[string]uint64{"ringbuf_full": 9, "no_entry": 4, "events": 200}); n != 7 {
		t.Errorf("13 lost in all, 6 at the stop: %d while stopping, want 7", n)
	}
	bad := stopMark{read: func() (map[string]uint64, error) { return nil, errors.New("map gone") }}
	bad.mark()
	if n := bad.stopping(map[string]uint64{"ringbuf_full": 9}); n != 0 {
		t.Errorf("counters at the stop unread: %d while stopping, want 0 (all while tracing)", n)
	}
}
