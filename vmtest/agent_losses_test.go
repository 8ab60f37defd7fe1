package vmtest

// The agent's losses: what it lost while serving is what
// cudatrace_lost_events_total shows, and its exit line says it, apart from
// what was lost while it stopped. Privileged.

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var agentStoppedRE = regexp.MustCompile(`cudatrace agent: stopped \(([^)]*)\) after (\d+) events, (\d+) lost while serving \(cudatrace_lost_events_total\), (\d+) while stopping`)

// TestAgentLostEvents: a job hammers the agent's smallest ring buffer
// (4 threads allocating in tight loops), so events are lost while it
// serves; once it is done and the counters have been read again, the
// metric and the exit line on SIGINT agree to the event, and a stop with
// nothing running loses nothing.
func TestAgentLostEvents(t *testing.T) {
	ctx, dir := traceSetup(t)
	a := startAgent(t, ctx, "--ring-size", "256KiB", "--dump-dir", "")
	job := exec.CommandContext(ctx, workload("mix"), "4", "4000", "5")
	job.Env = fakeEnv(filepath.Join(dir, "fake.log"))
	if out, err := job.CombinedOutput(); err != nil {
		t.Fatalf("mix: %v\n%s", err, out)
	}
	// The agent reads the BPF counters once a second: wait until two
	// reads 1.5 s apart agree.
	lost := -1.0
	for deadline := time.Now().Add(20 * time.Second); ; {
		time.Sleep(1500 * time.Millisecond)
		n, _ := metric(t, parseMetrics(t, get(t, ctx, a.url+"/metrics", 200)), "cudatrace_lost_events_total")
		t.Logf("cudatrace_lost_events_total %v", n)
		if n == lost {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cudatrace_lost_events_total still moving (%v, then %v) 20s after the job ended", lost, n)
		}
		lost = n
	}
	if lost == 0 {
		t.Logf("no event was lost while serving: the check below holds trivially this time")
	}
	if err := a.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("the agent did not stop within 20s of SIGINT")
	}
	line := agentStoppedRE.FindStringSubmatch(a.stderr.String())
	if line == nil {
		t.Fatalf("no exit line saying the losses while serving and while stopping apart:\n%s", a.stderr.String())
	}
	serving, _ := strconv.ParseFloat(line[3], 64)
	stopping, _ := strconv.ParseUint(line[4], 10, 64)
	if line[1] != "interrupted" || serving != lost || stopping != 0 {
		t.Errorf("exit line %q: want interrupted, %v lost while serving (the metric) and 0 while stopping (nothing ran)",
			line[0], lost)
	}
	// The remedy names the ring the events were lost with, and a size to
	// try instead.
	if want := "with the ring buffer (256KiB) full: raise --ring-size, e.g. --ring-size 1MiB"; lost > 0 && !strings.Contains(a.stderr.String(), want) {
		t.Errorf("no warning saying %q:\n%s", want, a.stderr.String())
	}
}
