package vmtest

// cudatrace must never harm what it watches, never lose a recording, never
// hand a node's secrets to another local user (issue 20). Privileged.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procState is the state letter of /proc/PID/stat ('T': stopped), or 0
// when the process is gone.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// childrenOf lists pid's child processes with their comm.
func childrenOf(t *testing.T, pid int) map[int]string {
	t.Helper()
	out := map[int]string{}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			c, err := strconv.Atoi(s)
			if err != nil {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c))
			out[c] = strings.TrimSpace(string(comm))
		}
	}
	return out
}

// waitFor polls cond every 5 ms until it holds or timeout passes, and
// says how long it took.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHeldProcessOutlivesTracer: a launched process that BPF stopped at its
// first allocation for the reader runs on within 1 s when the tracer is
// SIGKILLed before the reader got to it. The tracer is stopped (SIGSTOP)
// first so that its reader cannot resume the process itself.
func TestHeldProcessOutlivesTracer(t *testing.T) {
	ctx, dir := traceSetup(t)
	stdin, feed, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { feed.Close() })
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(filepath.Join(dir, "fake.log")), Stdin: stdin},
		"--lib", fakeLib, "-o", filepath.Join(dir, "held.trace"), "--", workload("hold"))
	stdin.Close()
	rec.waitAttached(t, 30*time.Second)
	if _, ok := waitFor(20*time.Second, func() bool { return strings.Contains(rec.stdout.String(), "ready\n") }); !ok {
		t.Fatalf("hold never printed ready")
	}
	tracer := rec.cmd.Process.Pid
	var hold, dog int
	for pid, comm := range childrenOf(t, tracer) {
		switch comm {
		case "hold":
			hold = pid
		case "cudatrace":
			dog = pid
		}
	}
	if hold == 0 {
		t.Fatalf("no child named hold under the tracer (pid %d): %v", tracer, childrenOf(t, tracer))
	}
	t.Cleanup(func() { syscall.Kill(hold, syscall.SIGKILL) })

	if err := syscall.Kill(tracer, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(feed, "go")
	if _, ok := waitFor(5*time.Second, func() bool { return procState(hold) == 'T' }); !ok {
		t.Fatalf("hold (pid %d) was not stopped at its first allocation: state %q", hold, procState(hold))
	}
	if err := syscall.Kill(tracer, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took, ok := waitFor(time.Second, func() bool { return procState(hold) != 'T' })
	if !ok {
		t.Fatalf("1 s after the tracer's SIGKILL, hold (pid %d) is still stopped (state %q)", hold, procState(hold))
	}
	t.Logf("hold resumed %v after the tracer's SIGKILL", took.Round(time.Millisecond))
	// It runs on: its allocations are made and it says so.
	if _, ok := waitFor(2*time.Second, func() bool { return strings.Contains(rec.stdout.String(), "held\n") }); !ok {
		t.Errorf("hold did not run on to print held: stdout %q", rec.stdout.String())
	}
	if dog == 0 {
		t.Errorf("no watchdog (a cudatrace child) beside hold: %v", childrenOf(t, tracer))
	} else if _, ok := waitFor(time.Second, func() bool { return procState(dog) == 0 || procState(dog) == 'Z' }); !ok {
		t.Errorf("the watchdog (pid %d) still runs 1 s after the tracer died", dog)
	}
	feed.Close() // hold frees and exits
	if _, ok := waitFor(5*time.Second, func() bool { return procState(hold) == 0 || procState(hold) == 'Z' }); !ok {
		t.Errorf("hold did not exit after its stdin closed")
	}
}
