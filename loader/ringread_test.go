package loader

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"unsafe"
)

// fakeRing is a ring buffer in ordinary memory laid out as the kernel's
// mapping is (the data twice in a row), written as BPF writes it:
// reserve (the busy bit), commit or discard.
type fakeRing struct {
	r          ring
	cons, prod uint64
	size       uint64
}

func newFakeRing(size uint64) *fakeRing {
	f := &fakeRing{size: size}
	f.r = ring{consPos: &f.cons, prodPos: &f.prod, data: make([]byte, 2*size), mask: size - 1}
	return f
}

// put writes b twice, at off and off+size, as the double mapping shows it.
func (f *fakeRing) put(off uint64, b []byte) {
	for i, c := range b {
		p := (off + uint64(i)) & f.r.mask
		f.r.data[p], f.r.data[p+f.size] = c, c
	}
}

func (f *fakeRing) header(pos uint64, l uint32) {
	var h [ringHdrSize]byte
	binary.LittleEndian.PutUint32(h[:], l)
	f.put(pos, h[:])
}

// reserve makes room for a record of payload, busy, and returns where its
// header is.
func (f *fakeRing) reserve(payload []byte) uint64 {
	pos := f.prod
	f.header(pos, uint32(len(payload))|ringBusyBit)
	f.put(pos+ringHdrSize, payload)
	f.prod += ringHdrSize + (uint64(len(payload))+7)&^7
	return pos
}

func (f *fakeRing) commit(pos uint64, n int)  { f.header(pos, uint32(n)) }
func (f *fakeRing) discard(pos uint64, n int) { f.header(pos, uint32(n)|ringDiscardBit) }

func payload(i, n int) []byte {
	b := bytes.Repeat([]byte{byte(i)}, n)
	copy(b, fmt.Sprintf("record %d", i))
	return b
}

// The in-place reader hands over each committed record as it is, in
// order, across the end of the ring (the double mapping makes it one
// slice), skips discarded ones, stops at one still being written, and
// moves the consumer position past a record only after the handler
// returned: until then BPF cannot write over it.
func TestRingRead(t *testing.T) {
	f := newFakeRing(512)
	var got []string
	h := func(raw []byte) {
		// The consumer position is still at this record's header.
		if &f.r.data[(f.cons+ringHdrSize)&f.r.mask] != &raw[0] {
			t.Errorf("consumer position %d moved before the handler returned", f.cons)
		}
		got = append(got, fmt.Sprintf("%s/%d", raw[:8], len(raw)))
		if cap(raw) != len(raw) {
			t.Errorf("record of %d bytes with room for %d: an append would write into the ring", len(raw), cap(raw))
		}
	}
	// 5 records of 50 bytes (56 in the ring, 64 with the header).
	for i := range 5 {
		pos := f.reserve(payload(i, 50))
		if i == 2 {
			f.discard(pos, 50)
		} else if i != 4 {
			f.commit(pos, 50)
		}
	}
	if n := f.r.read(h, 2); n != 2 || f.cons != 128 {
		t.Fatalf("read(max 2) = %d, consumer at %d; want 2 at 128", n, f.cons)
	}
	if committed, writing := f.r.ready(); !committed || writing {
		t.Errorf("ready() = %v, %v with a committed record next", committed, writing)
	}
	if n := f.r.read(h, 10); n != 1 || f.cons != 256 {
		t.Fatalf("read = %d, consumer at %d; want 1 (one discarded, one still written) at 256", n, f.cons)
	}
	if committed, writing := f.r.ready(); committed || !writing {
		t.Errorf("ready() = %v, %v with a record being written next", committed, writing)
	}
	f.commit(256, 50)
	if n := f.r.read(h, 10); n != 1 || f.cons != 320 {
		t.Fatalf("read = %d, consumer at %d; want 1 at 320", n, f.cons)
	}
	if committed, writing := f.r.ready(); committed || writing {
		t.Errorf("ready() = %v, %v on an empty ring", committed, writing)
	}
	want := []string{"record 0/50", "record 1/50", "record 3/50", "record 4/50"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records %q, want %q", got, want)
	}
	// A wrapped record is the bytes BPF wrote, in one slice.
	var wrapped []byte
	pos := f.reserve(payload(9, 200)) // 328..528: past the end, 512
	f.commit(pos, 200)
	f.r.read(func(raw []byte) { wrapped = bytes.Clone(raw) }, 1)
	if !bytes.Equal(wrapped, payload(9, 200)) {
		t.Errorf("wrapped record %q, want %q", wrapped, payload(9, 200))
	}
}

// Before the handler gets a record, read has asked the CPU for the next
// one's header and first lines (prefetchNext), so that they come from the
// other CPU's cache while the handler works, not when read gets there:
// each record's header, BPF's, was a miss that cost an eighth of the
// reader's CPU.
func TestRingReadPrefetchesNext(t *testing.T) {
	f := newFakeRing(512)
	var asked []uintptr
	defer func(p func(uintptr)) { prefetchNext = p }(prefetchNext)
	prefetchNext = func(addr uintptr) { asked = append(asked, addr) }
	addr := func(pos uint64) uintptr { return uintptr(unsafe.Pointer(&f.r.data[pos&f.r.mask])) }
	sizes := []int{50, 120, 200, 40} // in the ring: 64, 136, 208 and 48 bytes
	var at []uint64
	for i, n := range sizes {
		pos := f.reserve(payload(i, n))
		f.commit(pos, n)
		at = append(at, pos)
	}
	next := f.prod
	i := 0
	h := func(raw []byte) {
		want := next
		if i+1 < len(at) {
			want = at[i+1]
		}
		if len(asked) != i+1 || asked[i] != addr(want) {
			t.Errorf("record %d handed over having asked for %#x; want the next record's header %#x (ring offset %d) asked for last", i, asked, addr(want), want&f.r.mask)
		}
		i++
	}
	if n := f.r.read(h, 10); n != len(sizes) {
		t.Fatalf("read = %d, want %d", n, len(sizes))
	}
}
