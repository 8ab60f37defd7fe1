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

// A process two tracers stopped is resumed only once both have read it:
// the first to read leaves it stopped, the last resumes it; the entries
// stay, marked read and resumed.
func TestReleaseTwoHolders(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root (BPF maps of other tracers)")
	}
	own, other := heldMap(t), heldMap(t)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := uint32(cmd.Process.Pid)
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
	const at = uint64(12345)
	for _, m := range []*ebpf.Map{own, other} {
		if err := m.Put(pid, at); err != nil {
			t.Fatal(err)
		}
	}
	tr := &Tracer{}
	tr.objs.Held = own
	if err := tr.Release(pid); err != nil {
		t.Fatal(err)
	}
	if !stopped() {
		t.Fatal("resumed while the other tracer had not read it")
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
	if err := tr.Release(pid); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if s, _ := proc.Stopped(int(pid)); s {
		t.Fatal("still stopped after the only holder read it")
	}
}
