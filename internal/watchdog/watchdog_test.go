package watchdog

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// heldMap makes a map shaped as BPF's `held`; it needs CAP_BPF.
func heldMap(t *testing.T) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: create a BPF map: %v", err)
		}
		t.Skipf("needs CAP_BPF to create a BPF map (run as root): %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func state(pid int) byte {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

func stopped(t *testing.T) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "30")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	if err := c.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); state(c.Process.Pid) != 'T'; {
		if time.Now().After(deadline) {
			t.Fatalf("sleep %d did not stop", c.Process.Pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c
}

// Resume continues the processes held longer than asked, and all of them
// with 0; an entry whose PID started after its stop is another process's:
// dropped, not signalled.
func TestResume(t *testing.T) {
	m := heldMap(t)
	t0 := BootNow()
	old, recent, reused := stopped(t), stopped(t), stopped(t)
	put := func(c *exec.Cmd, at uint64) {
		if err := m.Put(uint32(c.Process.Pid), at); err != nil {
			t.Fatal(err)
		}
	}
	put(old, BootNow())
	// Stopped a second before this sleep started: another process was held.
	put(reused, t0-uint64(time.Second))
	time.Sleep(200 * time.Millisecond)
	put(recent, BootNow())
	if n := Resume(m, 100*time.Millisecond, nil); n != 1 {
		t.Errorf("Resume(100ms) resumed %d, want 1 (the one held 200 ms)", n)
	}
	time.Sleep(50 * time.Millisecond)
	if s := state(old.Process.Pid); s == 'T' {
		t.Errorf("the process held 200 ms is still stopped")
	}
	if s := state(recent.Process.Pid); s != 'T' {
		t.Errorf("the process held just now was resumed (state %q)", s)
	}
	if s := state(reused.Process.Pid); s != 'T' {
		t.Errorf("a process that started after the stop was signalled (state %q)", s)
	}
	var at uint64
	if err := m.Lookup(uint32(reused.Process.Pid), &at); err == nil {
		t.Errorf("the reused PID's entry is still there")
	}
	if n := Resume(m, 0, nil); n != 1 {
		t.Errorf("Resume(0) resumed %d, want 1", n)
	}
	time.Sleep(50 * time.Millisecond)
	if s := state(recent.Process.Pid); s == 'T' {
		t.Errorf("Resume(0) left a process stopped")
	}
	var pid uint32
	if m.Iterate().Next(&pid, &at) {
		t.Errorf("entries left after Resume(0): pid %d", pid)
	}
}
