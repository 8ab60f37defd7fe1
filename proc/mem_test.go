package proc

import (
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
	"unsafe"
)

// TestEnviron reads a child's environment from its memory, as the tracer
// reads a traced process's: exactly what the child was started with. It
// reads as soon as Start returns, many times: the child is then often
// still inside execve, its stack not yet laid out (stat shows zero bounds
// for well under a millisecond), and a process just started is what the
// tracer most often reads.
func TestEnviron(t *testing.T) {
	env := []string{"RANK=3", "WORLD_SIZE=8", "EMPTY=", "PATH=" + os.Getenv("PATH")}
	for range 50 {
		cmd := exec.Command("sleep", "10")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		got, err := Environ(cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, env) {
			t.Fatalf("Environ = %q, want %q", got, env)
		}
	}
}

func TestEnvironGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if _, err := Environ(cmd.Process.Pid); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Environ of a reaped process: %v, want ErrNoProcess", err)
	}
}

// TestMemReadAt reads this process's own memory through the syscall a
// traced process's is read with, and fails on a range that is not mapped
// whole rather than returning part of it.
func TestMemReadAt(t *testing.T) {
	want := []byte("cudatrace reads memory without stopping anyone")
	m := OpenMem(os.Getpid())
	got := make([]byte, len(want))
	if err := m.ReadAt(got, uint64(uintptr(unsafe.Pointer(&want[0])))); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("ReadAt = %q, want %q", got, want)
	}
	if err := m.ReadAt(make([]byte, 8), 8); err == nil {
		t.Error("ReadAt of address 8: no error")
	}
}

func TestSplitEnviron(t *testing.T) {
	got := splitEnviron([]byte("A=1\x00\x00junk\x00B==2\x00=x\x00C=\x00"))
	want := []string{"A=1", "B==2", "C="}
	if !slices.Equal(got, want) {
		t.Errorf("splitEnviron = %q, want %q", got, want)
	}
}
