package pystack

import (
	"bytes"
	"errors"
	"os"
	"strings"
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

// Captures: a frame is named from its code object's capture, the error a
// capture showed wins over a later read's, and a capture of another code
// object at an address renews its frames once.
func TestCaptures(t *testing.T) {
	in := &Interp{Minor: 12, off: offsets312, types: objTypes{code: 0x1234}}
	head := make([]byte, 64)
	head[8] = 0x99 // ob_type: not PyCode_Type
	capture := func(ident uint64) *events.PyCodeCapture {
		return &events.PyCodeCapture{Code: 0x1000, Ident: ident, Head: head}
	}
	var cs Captures
	cs.Put(in, capture(1))
	if cs.Renewed(0x1000) {
		t.Errorf("first capture: renewed")
	}
	f := events.PyFrame{Code: 0x1000, Units: 3}
	c, read := cs.Name(in, os.Getpid(), f)
	if !read || c.Renew || c.Code != 0x1000 || c.Units != 3 || !strings.Contains(c.Error, "no longer a code object") {
		t.Errorf("named %+v (read %v), want the capture's error after a read", c, read)
	}
	cs.Put(in, capture(1))
	if cs.Renewed(0x1000) {
		t.Errorf("the same code object captured again: renewed")
	}
	cs.Put(in, capture(2))
	if !cs.Renewed(0x1000) {
		t.Fatalf("another code object at the address: not renewed")
	}
	if c, _ := cs.Name(in, os.Getpid(), f); !c.Renew {
		t.Errorf("first frame named after the renewal: %+v, want Renew", c)
	}
	if c, _ := cs.Name(in, os.Getpid(), f); c.Renew || cs.Renewed(0x1000) {
		t.Errorf("second frame named after the renewal: %+v, want no Renew", c)
	}
}
