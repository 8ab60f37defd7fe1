package pystack

import (
	"bytes"
	"errors"
	"testing"

	"github.com/cudatrace/cudatrace/events"
)

// A capture's parts overlap when CPython allocates the objects next to
// each other: a byte is captured if any part holds it, and reads take it
// from a part that holds all they ask for, never stopping at the first
// part whose range merely touches the address.
func TestCapturedOverlap(t *testing.T) {
	head := bytes.Repeat([]byte{1}, 64)
	name := bytes.Repeat([]byte{2}, 32)
	table := []byte{3, 4, 5, 6, 7, 8, 9, 10}
	c := captured{&events.PyCodeCapture{
		Code: 0x1000, Head: head,
		// The name object lies right after the code object's 64 bytes
		// captured; the table's data starts at the name part's end.
		Name: 0x1040, NameBytes: name,
		Table: 0x1060 - 32, TableBytes: append(bytes.Repeat([]byte{2}, 32), table...),
	}}
	if got := c.after(0x1040); got != 40 {
		t.Errorf("after(name) = %d, want 40 (the table part, not the head's 0 left)", got)
	}
	if got := c.after(0x1060); got != 8 {
		t.Errorf("after(table data) = %d, want 8", got)
	}
	b := make([]byte, 8)
	if err := c.ReadAt(b, 0x1060); err != nil || !bytes.Equal(b, table) {
		t.Errorf("ReadAt(table data) = %v, %v; want %v", b, err, table)
	}
	if err := c.ReadAt(make([]byte, 9), 0x1060); !errors.Is(err, ErrNotCaptured) {
		t.Errorf("ReadAt past every part: %v, want ErrNotCaptured", err)
	}
	if got := c.after(0x2000); got != 0 {
		t.Errorf("after(outside) = %d", got)
	}
}
