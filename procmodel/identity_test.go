package procmodel

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/tracefile"
)

// A process's job and rank are read from the environment it started
// with, from outside it; a later capture keeps them without reading again.
func TestReadIdentity(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=4", "GROUP_RANK=0",
		"TORCHELASTIC_RUN_ID=job-7", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := uint32(cmd.Process.Pid)
	// Until exec, the child's memory is the forked Go runtime's.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(b)) == "sleep" {
			break
		} else if time.Now().After(deadline) {
			t.Fatal("the child never ran sleep")
		}
	}
	var ids BuildIDs
	c, _ := Read(pid, "sleep", 1, &ids, nil)
	if c.JobError != "" || c.Job == nil {
		t.Fatalf("job %+v, error %q", c.Job, c.JobError)
	}
	if c.JobID() != "torchrun:job-7" || c.Rank() != 0 || c.Job.WorldSize != 4 || c.Job.Launcher != "torchrun" {
		t.Errorf("identity %+v, want rank 0 of 4 in torchrun:job-7", c.Job)
	}
	// Read once: a later capture of the same process keeps the first's,
	// and a capture of another process with the PID reads its own.
	prev := &Capture{PID: pid, Start: c.Start, Job: &jobid.Identity{Job: "kept", Rank: 9}}
	if again, _ := Read(pid, "sleep", 2, &ids, prev); again.Job != prev.Job {
		t.Errorf("recapture read %+v, want the first capture's %+v", again.Job, prev.Job)
	}
	// So are its command line and container, which a process that
	// renames itself (setproctitle) rewrites, while it runs the same
	// program; an exec's capture before it is another program's.
	prev.Exe, prev.Cmdline, prev.Container, prev.Pod = c.Exe, []string{"sleep", "as", "started"}, "ctr", "pod"
	if again, _ := Read(pid, "sleep", 2, &ids, prev); !reflect.DeepEqual(again.Cmdline, prev.Cmdline) ||
		again.Container != "ctr" || again.Pod != "pod" {
		t.Errorf("recapture: command line %q, container %q, pod %q; want the first capture's", again.Cmdline, again.Container, again.Pod)
	}
	prev.Exe = "/usr/bin/python3"
	if after, _ := Read(pid, "sleep", 2, &ids, prev); !reflect.DeepEqual(after.Cmdline, []string{"sleep", "30"}) || after.Container == "ctr" {
		t.Errorf("a capture after an exec: command line %q, container %q; want its own", after.Cmdline, after.Container)
	}
	prev.Exe = c.Exe
	prev.Start++
	if other, _ := Read(pid, "sleep", 2, &ids, prev); other.JobID() != "torchrun:job-7" || !reflect.DeepEqual(other.Cmdline, []string{"sleep", "30"}) {
		t.Errorf("another process's capture kept %+v, %q", other.Job, other.Cmdline)
	}
	// A process gone is no identity error: its capture says it exited.
	gone, _ := Read(1<<22+1, "x", 3, &ids, nil)
	if gone.Job != nil || gone.JobError != "" || gone.Error == "" {
		t.Errorf("a missing process: job %+v, job error %q, error %q", gone.Job, gone.JobError, gone.Error)
	}
	// A capture made as the process exits, when its start can no longer
	// be read, keeps the job the first capture read.
	cmd.Process.Kill()
	cmd.Wait()
	prev.Start = c.Start
	if late, _ := Read(pid, "sleep", 4, &ids, prev); late.Job != prev.Job {
		t.Errorf("a capture after the exit: job %+v, want the first capture's %+v", late.Job, prev.Job)
	}
}

// The process frame keeps job and rank, rank 0 included, and node and
// node PID; old frames without them read as none.
func TestIdentityFileRoundTrip(t *testing.T) {
	c := &Capture{PID: 4194305, Comm: "python3", Maps: maps("/usr/bin/python3"), Node: "node-b", NodePID: 77,
		Job: &jobid.Identity{Job: "slurm:42.0", Name: "train", Launcher: "slurm", Rank: 0, LocalRank: 0, WorldSize: 2,
			NodeRank: -1, Vars: []string{"SLURM_JOB_ID=42"}}, JobError: ""}
	if got := FromFile(c.File()); !reflect.DeepEqual(got, c) {
		t.Errorf("round trip %+v, want %+v", got, c)
	}
	b, err := json.Marshal(c.File().Job)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":"slurm:42.0","name":"train","launcher":"slurm","rank":0,"local_rank":0,"world_size":2,"vars":["SLURM_JOB_ID=42"]}`
	if string(b) != want {
		t.Errorf("job JSON %s, want %s", b, want)
	}
	var old tracefile.Process
	if err := json.Unmarshal([]byte(`{"pid":7,"comm":"train","boot_ns":1,"maps":null}`), &old); err != nil {
		t.Fatal(err)
	}
	if o := FromFile(&old); o.Job != nil || o.Rank() != -1 || o.Node != "" || o.HostPID() != 7 {
		t.Errorf("an old process frame reads as %+v", o)
	}
}

func TestTitle(t *testing.T) {
	ranked := &jobid.Identity{Job: "j", Rank: 3, LocalRank: -1, NodeRank: -1}
	for _, c := range []struct {
		c    *Capture
		want string
	}{
		{nil, "train (7)"},
		{&Capture{PID: 7, Comm: "python3"}, "python3 (7)"},
		{&Capture{PID: 7, Comm: "python3", Job: ranked}, "rank 3 · pid 7"},
		{&Capture{PID: 4194305, NodePID: 4242, Node: "node-b", Comm: "python3", Job: ranked}, "rank 3 · node-b · pid 4242"},
		{&Capture{PID: 7, Node: "node-a", Comm: "python3"}, "python3 · node-a · pid 7"},
		// A job without a rank (a Ray worker) is titled as any process.
		{&Capture{PID: 7, Comm: "ray::Worker", Job: &jobid.Identity{Job: "ray:01", Rank: -1}}, "ray::Worker (7)"},
	} {
		if got := Title(c.c, 7, "train"); got != c.want {
			t.Errorf("Title(%+v) = %q, want %q", c.c, got, c.want)
		}
	}
}

// A merged trace's process is another host's: never looked up in this
// host's /proc by its PID.
func TestMergedCaptureNotLive(t *testing.T) {
	self := uint32(os.Getpid())
	c := &Capture{PID: self, Node: "node-b"}
	if p := c.Symbol(); p.PID != 0 || p.Live() {
		t.Errorf("a merged capture's symbolize.Proc %+v looks live", p)
	}
}
