package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/agent"
)

// TestAgentOOMNode: one of three processes on the node runs out of
// memory; its black box says what the other two held at that moment, by
// device, with their job and rank, and the live set of its job's other
// rank by stack.
func TestAgentOOMNode(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log, dumps := filepath.Join(dir, "fake.log"), filepath.Join(dir, "oom")
	ag := startAgent(t, ctx, "--dump-dir", dumps)
	jobEnv := []string{"WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=node-oom"}
	r0 := startJob(t, ctx, log, append(jobEnv, "RANK=0")...)
	r0.do(t, "ok", "weights %d 0", 1000000)
	r0.do(t, "ok", "weights %d 1", 2000000)
	host := startJob(t, ctx, log)
	host.do(t, "ok", "weights %d 0", 3000000)
	r1 := startJob(t, ctx, log, append(jobEnv, "RANK=1")...)
	r1.do(t, "ok", "weights %d 0", 777)
	r1.do(t, "oom", "grow %d", 2*fakeMemLimit)

	var files []string
	for deadline := time.Now().Add(20 * time.Second); len(files) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-torchrun_node-oom-rank1-%d-*.json", r1.pid)))
	}
	if len(files) != 1 {
		t.Fatalf("OOM dump of rank 1: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var rep agent.OOMReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Node == nil || len(rep.Node.Processes) != 2 {
		t.Fatalf("the dump's node: %s", b)
	}
	byPID := map[int]agent.OOMNodeProcess{}
	for _, p := range rep.Node.Processes {
		byPID[int(p.PID)] = p
	}
	for _, j := range []*job{r0, host} {
		p, ok := byPID[j.pid]
		tr := truths[j.pid]
		if !ok || tr == nil {
			t.Errorf("pid %d not in the dump's node: %s", j.pid, b)
			continue
		}
		if p.LiveBytes != tr.Live {
			t.Errorf("pid %d held %d bytes, ground truth %d", j.pid, p.LiveBytes, tr.Live)
		}
		for _, d := range p.Devices {
			if dt := tr.Devices[int(d.Device)]; dt == nil || d.LiveBytes != dt.Live {
				t.Errorf("pid %d device %d: %d bytes, ground truth %+v", j.pid, d.Device, d.LiveBytes, dt)
			}
		}
		if len(p.Devices) != len(tr.Devices) {
			t.Errorf("pid %d: devices %+v, ground truth %d devices", j.pid, p.Devices, len(tr.Devices))
		}
	}
	rank0, other := byPID[r0.pid], byPID[host.pid]
	if !rank0.SameJob || rank0.Rank == nil || *rank0.Rank != 0 || rank0.JobID != "torchrun:node-oom" {
		t.Errorf("rank 0 in rank 1's dump: %+v", rank0)
	}
	// Its live set by stack, the failed call's device (0) first.
	var stacks []string
	var sum uint64
	for _, s := range rank0.LiveStacks {
		var fs []string
		for _, f := range s.Frames {
			fs = append(fs, f.Function)
		}
		stacks = append(stacks, fmt.Sprintf("%d:%s", s.Device, strings.Join(fs, "<")))
		sum += s.LiveBytes
	}
	if sum != truths[r0.pid].Live || len(stacks) != 2 || !strings.HasPrefix(stacks[0], "0:") || !strings.Contains(stacks[0], "load_weights") {
		t.Errorf("rank 0's live stacks: %q (%d bytes), want its %d bytes, device 0 first", stacks, sum, truths[r0.pid].Live)
	}
	if other.SameJob || other.Rank != nil || len(other.LiveStacks) != 0 {
		t.Errorf("the host's process in rank 1's dump: %+v", other)
	}
	// The node's sums: everyone's, rank 1's included.
	want := map[int32]uint64{}
	for _, tr := range truths {
		for d, dt := range tr.Devices {
			want[int32(d)] += dt.Live
		}
	}
	for _, d := range rep.Node.Devices {
		if d.LiveBytes != want[d.Device] {
			t.Errorf("node device %d: %d bytes, ground truth %d", d.Device, d.LiveBytes, want[d.Device])
		}
	}
	if len(rep.Node.Devices) != len(want) {
		t.Errorf("node devices %+v, want %v", rep.Node.Devices, want)
	}
	for _, j := range []*job{r0, host, r1} {
		j.end(t)
	}
	ag.stop(t)
}
