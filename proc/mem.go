package proc

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Mem reads another process's memory with process_vm_readv(2): ptrace
// access to it is all that takes (the same user, or CAP_SYS_PTRACE), where
// opening /proc/PID/mem, a 0600 file of the process's owner, also takes
// CAP_DAC_OVERRIDE for another user's process. No file is opened, so there
// is nothing to close, and the process is never stopped: what is read is
// whatever the process holds at that moment (callers check what they read).
type Mem struct{ pid int }

// OpenMem returns process pid's memory for reading.
func OpenMem(pid int) Mem { return Mem{pid} }

// PID is the process whose memory m reads.
func (m Mem) PID() int { return m.pid }

// ReadAt reads len(b) bytes at addr of the process's memory: all of them,
// or an error (a range not mapped whole is one, as is a process that has
// exited, ErrNoProcess).
func (m Mem) ReadAt(b []byte, addr uint64) error {
	if len(b) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	n, err := unix.ProcessVMReadv(m.pid, local, remote, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("pid %d: %w", m.pid, ErrNoProcess)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("read pid %d's memory: %w (reading another user's process takes CAP_SYS_PTRACE)", m.pid, err)
	case err != nil:
		return fmt.Errorf("read %d bytes at %#x of pid %d: %w", len(b), addr, m.pid, err)
	case n != len(b):
		// A range that crosses into an unmapped page reads up to it.
		return fmt.Errorf("read %d bytes at %#x of pid %d: only %d are mapped", len(b), addr, m.pid, n)
	}
	return nil
}

// Environ returns the environment process pid started with (or set up in
// place of it), as NAME=value strings, read from its memory between the
// bounds /proc/PID/stat gives (env_start, env_end: shown to whoever has
// ptrace access to it), so it needs no more privilege than Mem. A process
// that wrote over that area since (setproctitle: libcenv.go) has its
// environment read from the copies its C library's environ points at:
// the strings it started with, unless it changed them itself since
// (setenv), which the area, were it intact, would not show. A process
// whose environment cannot be read is an error saying why.
func Environ(pid int) ([]string, error) {
	lo, hi, err := envBounds(pid)
	if err != nil {
		return nil, err
	}
	if hi < lo || hi-lo > maxEnviron {
		return nil, fmt.Errorf("pid %d: environment of %d bytes at %#x: not read", pid, int64(hi-lo), lo)
	}
	b := make([]byte, hi-lo)
	if err := OpenMem(pid).ReadAt(b, lo); err != nil {
		return nil, err
	}
	if !clobbered(b) {
		return splitEnviron(b), nil
	}
	env, err := libcEnviron(pid)
	if err != nil {
		if errors.Is(err, ErrNoProcess) {
			return nil, err
		}
		return nil, fmt.Errorf("pid %d wrote over its environment's memory (setproctitle), and its C library's copy could not be read: %w", pid, err)
	}
	return env, nil
}

// envBounds reads env_start and env_end from pid's stat. Zeros there mean
// one of three things, which the fields beside them tell apart: no memory
// at all (a kernel thread, a process exiting), a reader without ptrace
// access (the kernel then shows 1 for start_code and end_code), or a
// process inside execve(2), whose new memory is in place (and its parent
// told, by close-on-exec, that the exec succeeded) before the kernel has
// laid out its stack and set the bounds. That last lasts well under a
// millisecond, so it is waited out, briefly: a process just started is
// what the tracer most often reads.
func envBounds(pid int) (lo, hi uint64, err error) {
	deadline := time.Now().Add(execWait)
	for {
		// Fields 23 (vsize), 26, 27 (start_code, end_code), 50 and 51
		// (env_start, env_end); the first after ')' is field 3.
		f, err := statFields(pid, 49)
		if err != nil {
			return 0, 0, err
		}
		lo, err1 := strconv.ParseUint(f[47], 10, 64)
		hi, err2 := strconv.ParseUint(f[48], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("pid %d: malformed stat: env_start %q, env_end %q", pid, f[47], f[48])
		}
		switch {
		case lo != 0 || hi != 0:
			return lo, hi, nil
		case f[20] == "0":
			return 0, 0, fmt.Errorf("pid %d: has no memory (a kernel thread, or exiting): no environment to read", pid)
		case f[23] == "1" && f[24] == "1":
			return 0, 0, fmt.Errorf("pid %d: its environment is not shown to this process (reading another user's process takes CAP_SYS_PTRACE)", pid)
		case time.Now().After(deadline):
			return 0, 0, fmt.Errorf("pid %d: its environment was still not laid out %v into an exec", pid, execWait)
		}
		time.Sleep(time.Millisecond)
	}
}

// execWait bounds the wait for an exec to lay out its new stack.
const execWait = 100 * time.Millisecond

// maxEnviron bounds the environment read: Linux caps argv and envp
// together at a quarter of the stack limit, a few MiB with default limits.
const maxEnviron = 16 << 20

// splitEnviron splits NUL-separated NAME=value strings, dropping empty
// ones and anything without '=' (a process that wrote over its
// environment's memory).
func splitEnviron(b []byte) []string {
	var out []string
	for _, kv := range bytes.Split(b, []byte{0}) {
		if i := bytes.IndexByte(kv, '='); i > 0 {
			out = append(out, string(kv))
		}
	}
	return out
}
