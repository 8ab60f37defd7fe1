package loader

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ring reads the events ring buffer where the kernel wrote it: each record
// goes to the handler as a slice of the mapped ring, and the consumer
// position moves past it only once the handler has returned, so BPF cannot
// write over a record while it is being read. ringbuf.Reader copies every
// record out first; an allocation record holds its stack window (17.6 KiB
// a record by default, of which the unwinder reads a few words), and that
// copy was the largest part of the reader's CPU per event.
//
// Waiting goes through Go's network poller (the ring's descriptor, in
// non-blocking mode, in an os.File): ringbuf.Reader blocked its thread in
// epoll_wait, and every such block woke the runtime's monitor thread
// (sysmon) into polling every 20 µs for a millisecond or more, a quarter of
// the reader's CPU on the 2-core VMs.
type ring struct {
	cons, prod []byte   // the mappings: the consumer page, and the producer page with the data pages twice after it
	consPos    *uint64  // in cons: advanced by the reader
	prodPos    *uint64  // in prod: advanced by the kernel
	data       []byte   // the data pages, mapped twice in a row: a record never wraps
	mask       uint64   // data size - 1
	file       *os.File // a duplicate of the map's descriptor, in the network poller
	conn       interface {
		Read(func(fd uintptr) bool) error
	}
}

// The ring buffer's record header (include/uapi/linux/bpf.h
// BPF_RINGBUF_*): the record's length, with two flag bits, and 4 bytes
// the kernel uses for itself.
const (
	ringHdrSize    = 8
	ringBusyBit    = 1 << 31 // reserved, not committed yet
	ringDiscardBit = 1 << 30 // discarded: skip it
)

func newRing(m *ebpf.Map) (*ring, error) {
	size := int(m.MaxEntries())
	if size <= 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer of %d bytes: not a power of two", size)
	}
	page := os.Getpagesize()
	r := &ring{}
	var err error
	if r.cons, err = unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("map the ring buffer's consumer page: %w", err)
	}
	if r.prod, err = unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		r.Close()
		return nil, fmt.Errorf("map the ring buffer's data pages: %w", err)
	}
	r.consPos = (*uint64)(unsafe.Pointer(&r.cons[0]))
	r.prodPos = (*uint64)(unsafe.Pointer(&r.prod[0]))
	r.data = r.prod[page:]
	r.mask = uint64(size - 1)

	fd, err := unix.FcntlInt(uintptr(m.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("duplicate the ring buffer's descriptor: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		r.Close()
		return nil, fmt.Errorf("ring buffer's descriptor: %w", err)
	}
	r.file = os.NewFile(uintptr(fd), "ringbuf")
	// A descriptor the poller would not take has no deadlines.
	if err := r.file.SetReadDeadline(time.Time{}); err != nil {
		r.Close()
		return nil, fmt.Errorf("poll the ring buffer: %w", err)
	}
	conn, err := r.file.SyscallConn()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("poll the ring buffer: %w", err)
	}
	r.conn = conn
	return r, nil
}

// read hands each record committed so far to h, at most max of them, in
// order, and says how many it handed over. raw is the ring's own memory,
// read-only and valid until h returns: BPF reuses it once the consumer
// position has moved past it. It stops at a record still being written.
func (r *ring) read(h func(raw []byte), max int) int {
	n := 0
	cons := atomic.LoadUint64(r.consPos)
	for n < max {
		prod := atomic.LoadUint64(r.prodPos)
		if prod-cons < ringHdrSize {
			break
		}
		// The kernel writes the length word last (an atomic exchange, on
		// commit): read it atomically, before the data it covers.
		l := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if l&ringBusyBit != 0 {
			break
		}
		size := uint64(l &^ (ringBusyBit | ringDiscardBit))
		start := (cons + ringHdrSize) & r.mask
		next := cons + ringHdrSize + (size+7)&^7
		// The next record's length word and first lines, fetched while h
		// works: BPF wrote them from another CPU, and the wait for them at
		// the top of the loop was most of read's time, an eighth of the
		// reader's CPU (a miss on the other CPU's cache, and on the TLB: a
		// record spans five pages). Within the mapping: the data pages are
		// mapped twice.
		prefetchNext(uintptr(unsafe.Pointer(&r.data[next&r.mask])))
		if l&ringDiscardBit == 0 {
			h(r.data[start : start+size : start+size])
			n++
		}
		cons = next
		atomic.StoreUint64(r.consPos, cons)
	}
	return n
}

// prefetchNext is the prefetch read asks for the next record with (tests
// see what it asks for through it).
var prefetchNext = prefetch

// ready says whether a committed record waits at the consumer position,
// and whether one being written does (read stops there).
func (r *ring) ready() (committed, writing bool) {
	cons := atomic.LoadUint64(r.consPos)
	if atomic.LoadUint64(r.prodPos)-cons < ringHdrSize {
		return false, false
	}
	busy := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))&ringBusyBit != 0
	return !busy, busy
}

// busyWait is how long wait waits at most while a record is being
// written at the consumer position: BPF commits it within microseconds,
// most likely without a wakeup.
const busyWait = time.Millisecond

// wait parks the calling goroutine until a committed record waits, the
// kernel wakes the reader (BPF_RB_FORCE_WAKEUP, or a record committed right
// after the consumer caught up), or d passes. Records committed with
// BPF_RB_NO_WAKEUP wake nobody: they wait for the deadline.
func (r *ring) wait(d time.Duration) error {
	committed, writing := r.ready()
	if committed || d <= 0 {
		return nil
	}
	if writing {
		d = min(d, busyWait)
	}
	if err := r.file.SetReadDeadline(time.Now().Add(d)); err != nil {
		return fmt.Errorf("wait for the ring buffer: %w", err)
	}
	// Read calls the function, and while it says false waits for the
	// descriptor to turn readable (edge-triggered: a wakeup after the
	// first call is not missed) or the deadline.
	err := r.conn.Read(func(uintptr) bool {
		committed, _ := r.ready()
		return committed
	})
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("wait for the ring buffer: %w", err)
	}
	return nil
}

// Close unmaps the ring and closes its descriptor's duplicate.
func (r *ring) Close() error {
	var errs []error
	if r.file != nil {
		errs = append(errs, r.file.Close())
		r.file = nil
	}
	for _, m := range [][]byte{r.prod, r.cons} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	r.prod, r.cons, r.data = nil, nil, nil
	return errors.Join(errs...)
}
