package vmtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/loader"
)

// TestBurstKeepsEvents: a burst of allocations while the reader is kept
// away (record stopped with SIGSTOP, as a busy node's CPUs keep it) fills
// the ring buffer. With stack windows (CUDATRACE_UNWIND=window), once the
// reader is behind by half the ring, records go without their windows,
// their frames from the frame pointers, copied at the few hundred bytes
// they use: a burst of 300 allocations into a ring that holds 14 records
// with windows keeps every one, each with its stack (burst.c is built
// with frame pointers), and record says how many went without a window.
// Before (bc0a3ce), the records past what the ring held with windows were
// lost: 286 of them. Unwound in BPF (the default), records are copied to
// the ring at the size they use (256 bytes for burst.c's stacks), and the
// same ring holds the whole burst with its stacks unwound in BPF: none
// goes without. Before (4625506) they were reserved at some 1.6 KiB, and
// past the 80 that fill half the ring the rest went without.
func TestBurstKeepsEvents(t *testing.T) {
	const ring = 256 << 10
	t.Run("window", func(t *testing.T) {
		full := int(loader.RecordBytes(loader.DefaultStackWindow))
		burstKeepsEvents(t, ring, ring/full, "CUDATRACE_UNWIND=window")
	})
	t.Run("bpf", func(t *testing.T) {
		burstKeepsEvents(t, ring, ring/(256+8))
	})
}

// burstKeepsEvents is TestBurstKeepsEvents in a ring of ring bytes, with
// env, where at most fit records go with their stacks (unwound in BPF,
// where fit is more than the burst) before the rest go without their
// windows.
func burstKeepsEvents(t *testing.T, ring, fit int, env ...string) {
	ctx, dir := traceSetup(t)
	const n = 300
	inBPF := fit > n
	if !inBPF && fit >= n/3 {
		t.Fatalf("a %d-byte ring takes %d records before it is half full: the burst of %d is no burst", ring, fit, n)
	}
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "burst.trace")
	stdin, feed := io.Pipe()
	defer feed.Close()
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log, env...), Stdin: stdin},
		"--ring-size", "256KiB", "--lib", fakeLib, "-o", trace, "--", workload("burst"), strconv.Itoa(n))
	waitOutput := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(rec.stdout.String(), what); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("burst did not say %q in 30s:\n%s\n%s", what, rec.stdout.String(), rec.stderr.String())
			}
		}
	}
	waitOutput("ready")
	// The first allocation's record read (its process known): the ring
	// is empty when the reader stops.
	time.Sleep(time.Second)
	if err := rec.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	// The signal is sent, not yet taken: wait until each of record's
	// threads is stopped.
	waitStopped(t, rec.cmd.Process.Pid)
	defer func() {
		if stopped {
			rec.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	if _, err := io.WriteString(feed, "go\n"); err != nil {
		t.Fatal(err)
	}
	waitOutput("done")
	if err := rec.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stopped = false
	feed.Close()
	rec.finish(t, 45*time.Second)

	want := onlyTruth(t, log, "")
	const mib = 1 << 20
	if want.Allocs != uint64(n+1) || want.Live != uint64(n+1)*mib {
		t.Fatalf("ground truth: %d allocations, %d bytes live; want %d of 1 MiB", want.Allocs, want.Live, n+1)
	}
	rep := runReport(t, ctx, trace)
	if rep.LostEvents != 0 {
		t.Errorf("lost_events = %d, want 0", rep.LostEvents)
	}
	checkProcess(t, rep, want, 0, "burst")
	// Every allocation's stack, with or without its window, reaches main
	// through burst_alloc.
	var withStack uint64
	for _, s := range rep.Stacks {
		var names []string
		for _, f := range s.Frames {
			names = append(names, f.Function)
		}
		if s.PID == want.PID && slices.Contains(names, "burst_alloc") && slices.Contains(names, "main") {
			withStack += s.Allocs
		} else if s.PID == want.PID {
			t.Errorf("stack of %d allocations: %s, want burst_alloc ... main", s.Allocs, strings.Join(names, " < "))
		}
	}
	if withStack != uint64(n+1) {
		t.Errorf("%d allocations with stacks through burst_alloc to main, want %d", withStack, n+1)
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var counters struct {
		Counters map[string]uint64 `json:"counters"`
	}
	if err := json.Unmarshal(out, &counters); err != nil {
		t.Fatal(err)
	}
	if inBPF {
		// Every record of the burst unwound in BPF (the one before it
		// may come before the rules for burst's files), none without.
		if got := counters.Counters["unwound_in_bpf"]; got < n || got > n+1 {
			t.Errorf("unwound_in_bpf = %d, want %d or %d (the burst's records, all in a ring that holds %d)", got, n, n+1, fit)
		}
		if got := counters.Counters["ringbuf_no_window"]; got != 0 {
			t.Errorf("ringbuf_no_window = %d, want 0 (records of 256 bytes, %d in the ring)", got, fit)
		}
		return
	}
	if got := counters.Counters["ringbuf_no_window"]; got < uint64(n)-uint64(fit) || got > uint64(n) {
		t.Errorf("ringbuf_no_window = %d, want %d to %d (the records past the %d the ring held with their stacks)", got, uint64(n)-uint64(fit), n, fit)
	}
	if want := "allocations were recorded without their stack windows (the reader was behind by more than half the ring buffer, 256KiB, in a burst)"; !strings.Contains(rec.stderr.String(), want) {
		t.Errorf("record did not say %q:\n%s", want, rec.stderr.String())
	}
	text, err := exec.CommandContext(ctx, tracerBin, "report", trace).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("Note: %d allocations were recorded without their stack windows", counters.Counters["ringbuf_no_window"]); !strings.Contains(string(text), want) ||
		strings.Contains(string(text), "LOST") {
		t.Errorf("report says no %q, or says events were lost:\n%s", want, text)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc/PID/task/TID/stat).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		running := len(tasks) == 0
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if i := bytes.LastIndexByte(b, ')'); err == nil && i >= 0 && i+2 < len(b) && b[i+2] != 'T' {
				running = true
			}
		}
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d not stopped 10s after SIGSTOP", pid)
		}
	}
}
