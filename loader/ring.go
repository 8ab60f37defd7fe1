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
// position moves past it once the handler returns. ringbuf.Reader copies
// every record out first; an allocation record holds its stack window
// (16 KiB by default, of which the unwinder reads a few words), and that
// copy was the reader's largest cost per event.
type ring struct {
	cons, prod []byte   // the mappings: the consumer page, and the producer page with the data twice after it
	consPos    *uintptr // in cons: advanced by us
	prodPos    *uintptr // in prod: advanced by the kernel
	data       []byte   // the data pages, mapped twice in a row: a record never wraps
	mask       uintptr
	epfd       int
	evs        [1]unix.EpollEvent
}

// ringbuf record header (include/uapi/linux/bpf.h).
const (
	ringHdrSize   = 8
	ringBusyBit   = 1 << 31
	ringDiscardBt = 1 << 30
)

func newRing(m *ebpf.Map) (*ring, error) {
	size := int(m.MaxEntries())
	if size <= 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer of %d bytes: not a power of two", size)
	}
	page := os.Getpagesize()
	r := &ring{epfd: -1}
	var err error
	if r.cons, err = unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("map the consumer page: %w", err)
	}
	if r.prod, err = unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		r.Close()
		return nil, fmt.Errorf("map the data pages: %w", err)
	}
	r.consPos = (*uintptr)(unsafe.Pointer(&r.cons[0]))
	r.prodPos = (*uintptr)(unsafe.Pointer(&r.prod[0]))
	r.data = r.prod[page:]
	r.mask = uintptr(size - 1)
	if r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		r.Close()
		return nil, fmt.Errorf("epoll: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(m.FD())}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, m.FD(), &ev); err != nil {
		r.Close()
		return nil, fmt.Errorf("epoll the ring buffer: %w", err)
	}
	return r, nil
}

// wait blocks until the kernel wakes the reader (BPF_RB_FORCE_WAKEUP, or
// unread data past the wakeup mark) or d passes.
func (r *ring) wait(d time.Duration) error {
	_, err := unix.EpollWait(r.epfd, r.evs[:], int(d.Milliseconds()))
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("wait for the ring buffer: %w", err)
	}
	return nil
}

// read hands each record committed so far to h, at most max of them, in
// order, and says how many it read. raw is the ring's own memory,
// read-only and valid until h returns. It stops at a record still being
// written.
func (r *ring) read(h func(raw []byte), max int) int {
	n := 0
	cons := atomic.LoadUintptr(r.consPos)
	for n < max {
		prod := atomic.LoadUintptr(r.prodPos)
		if prod-cons < ringHdrSize {
			break
		}
		// The length word is written last by the kernel (xchg): read it
		// atomically, before the data it covers.
		l := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if l&ringBusyBit != 0 {
			break
		}
		size := uintptr(l &^ (ringBusyBit | ringDiscardBt))
		start := (cons + ringHdrSize) & r.mask
		next := cons + ringHdrSize + (size+7)&^7
		if l&ringDiscardBt == 0 {
			h(r.data[start : start+size : start+size])
			n++
		}
		cons = next
		atomic.StoreUintptr(r.consPos, cons)
	}
	return n
}

// Close unmaps the ring and closes the poller.
func (r *ring) Close() error {
	var errs []error
	if r.epfd >= 0 {
		errs = append(errs, unix.Close(r.epfd))
		r.epfd = -1
	}
	for _, m := range [][]byte{r.prod, r.cons} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	r.prod, r.cons, r.data = nil, nil, nil
	return errors.Join(errs...)
}
