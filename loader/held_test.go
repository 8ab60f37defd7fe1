package loader

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cudatrace/cudatrace/internal/testenv"
	"github.com/cudatrace/cudatrace/internal/watchdog"
	"github.com/cudatrace/cudatrace/proc"
)

// heldMap makes a map of a tracer's `held` shape (bpf/common.h).
func heldMap(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "held", Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 1024})
	if err != nil {
		testenv.SkipOrFail(t, "create a BPF map (needs CAP_BPF): %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// startSleep starts a process to hold, killed at the end of the test.
func startSleep(t *testing.T) uint32 {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return uint32(cmd.Process.Pid)
}

// A process two tracers stopped is resumed only once both have read it:
// the first to read leaves it stopped, the last resumes it; the entries
// stay, marked read and resumed.
func TestReleaseTwoHolders(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (BPF maps of other tracers)")
	}
	own, other := heldMap(t), heldMap(t)
	pid := startSleep(t)
	stopped := func() bool {
		for range 100 { // signals are delivered asynchronously
			s, err := proc.Stopped(int(pid))
			if err != nil {
				t.Fatal(err)
			}
			if s {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	syscall.Kill(int(pid), syscall.SIGSTOP)
	if !stopped() {
		t.Fatal("sleep did not stop")
	}
	at := watchdog.BootNow() // held now: a peer's entry counts for watchdog.MaxHold
	for _, m := range []*ebpf.Map{own, other} {
		if err := m.Put(pid, at); err != nil {
			t.Fatal(err)
		}
	}
	tr := &Tracer{}
	tr.objs.Held = own
	if err := tr.Release(pid, at); err != nil {
		t.Fatal(err)
	}
	if !stopped() {
		t.Fatal("resumed while the other tracer had not read it")
	}
	if n := tr.peers.waits.Load(); n != 1 {
		t.Errorf("peer waits %d, want 1", n)
	}
	var v uint64
	if err := own.Lookup(pid, &v); err != nil || v != at|watchdog.Released {
		t.Fatalf("own entry %#x (%v), want %#x: read, not resumed", v, err, at|watchdog.Released)
	}
	tr.releaseWaiting()
	if !stopped() {
		t.Fatal("resumed while the other tracer had not read it")
	}
	// The other tracer reads it: marks its entry, finds own's read.
	if err := other.Put(pid, at|watchdog.Released); err != nil {
		t.Fatal(err)
	}
	tr.releaseWaiting()
	time.Sleep(50 * time.Millisecond)
	if s, _ := proc.Stopped(int(pid)); s {
		t.Fatal("still stopped once both tracers had read it")
	}
	if err := own.Lookup(pid, &v); err != nil || v != at|watchdog.Released|watchdog.Resumed {
		t.Fatalf("own entry %#x (%v), want %#x: read and resumed", v, err, at|watchdog.Released|watchdog.Resumed)
	}
	// Alone, a tracer resumes at once.
	syscall.Kill(int(pid), syscall.SIGSTOP)
	if !stopped() {
		t.Fatal("sleep did not stop")
	}
	other.Delete(pid)
	if err := own.Put(pid, at); err != nil {
		t.Fatal(err)
	}
	if err := tr.Release(pid, at); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if s, _ := proc.Stopped(int(pid)); s {
		t.Fatal("still stopped after the only holder read it")
	}
}

// A process held at a record whose entry the reader's mark of an earlier
// hold overwrote (the mark comes after that hold's SIGCONT, and the
// process can be held again in between) is resumed when that record is
// read: its entry, marked resumed, is older than the record. A record
// older than the entry's mark leaves the process as it is.
func TestReleaseOverwrittenHold(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (BPF maps)")
	}
	own := heldMap(t)
	pid := startSleep(t)
	stoppedAfter := func() bool {
		time.Sleep(50 * time.Millisecond) // signals are delivered asynchronously
		s, err := proc.Stopped(int(pid))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	syscall.Kill(int(pid), syscall.SIGSTOP)
	if !stoppedAfter() {
		t.Fatal("sleep did not stop")
	}
	at := watchdog.BootNow() // the earlier hold, marked resumed after its SIGCONT
	if err := own.Put(pid, at|watchdog.Released|watchdog.Resumed); err != nil {
		t.Fatal(err)
	}
	tr := &Tracer{}
	tr.objs.Held = own
	// A record that returned before that hold: the mark is its own.
	if err := tr.Release(pid, at-1000); err != nil {
		t.Fatal(err)
	}
	if !stoppedAfter() {
		t.Fatal("resumed at a record the mark was for")
	}
	// A record that returned after it: held again, its entry overwritten.
	if err := tr.Release(pid, at+1000); err != nil {
		t.Fatal(err)
	}
	if stoppedAfter() {
		t.Fatal("left stopped at a hold whose entry the reader's mark had overwritten")
	}
	if n := tr.lostHolds.Load(); n != 1 {
		t.Errorf("lost holds %d, want 1", n)
	}
}

// A peer's entry holds the process only while unread and younger than
// watchdog.MaxHold: an older one is of a tracer that is not reading it,
// and waiting on it would make each hold last the watchdog's MaxHold.
func TestPeerHoldingAge(t *testing.T) {
	const now = uint64(100 * time.Second)
	maxHold := uint64(watchdog.MaxHold)
	for _, c := range []struct {
		what string
		at   uint64
		want bool
	}{
		{"held now", now, true},
		{"held just under MaxHold ago", now - maxHold + 1, true},
		{"held MaxHold ago", now - maxHold, false},
		{"held a minute ago", now - uint64(time.Minute), false},
		{"read by its tracer", now | watchdog.Released, false},
		{"resumed", now | watchdog.Released | watchdog.Resumed, false},
		{"resumed (mark alone)", now | watchdog.Resumed, false},
		{"stopped after we looked (clocks of two CPUs)", now + 1000, true},
	} {
		if got := peerHolding(c.at, now); got != c.want {
			t.Errorf("%s (%#x at %d): %v, want %v", c.what, c.at, now, got, c.want)
		}
	}
}

// A process another tracer held longer than watchdog.MaxHold ago, and
// never read, is resumed at once by the reader that read it; the wait is
// counted only where a live peer holds it.
func TestReleaseIgnoresStalePeer(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (BPF maps of other tracers)")
	}
	own, other := heldMap(t), heldMap(t)
	pid := startSleep(t)
	syscall.Kill(int(pid), syscall.SIGSTOP)
	for i := 0; i < 100; i++ {
		if s, _ := proc.Stopped(int(pid)); s {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	now := watchdog.BootNow()
	if err := other.Put(pid, now-uint64(watchdog.MaxHold)-uint64(time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := own.Put(pid, now); err != nil {
		t.Fatal(err)
	}
	tr := &Tracer{}
	tr.objs.Held = own
	if err := tr.Release(pid, now); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if s, _ := proc.Stopped(int(pid)); s {
		t.Fatal("left stopped for a peer entry held longer than watchdog.MaxHold ago")
	}
	if n := tr.peers.waits.Load(); n != 0 {
		t.Errorf("peer waits %d, want 0", n)
	}
}
