package report

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
	"github.com/cudatrace/cudatrace/tracefile"
)

// textOf is the text report of the trace at path.
func textOf(t *testing.T, path string, opts Options) (*Report, string) {
	t.Helper()
	rep, err := Load(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	return rep, buf.String()
}

// --rank 2 (here --pid, as the CLI turns it): the job's other ranks were
// traced, only left out, and a rank missing is said in words.
func TestJobFiltered(t *testing.T) {
	_, text := textOf(t, tracetest.TwoNodesMerged(t), Options{PIDs: []uint32{100}}) // rank 2
	if !strings.Contains(text, "Job slurm:42.0 (train): 1 rank shown of the 4 traced, world size 4 (the others left out by --rank or --pid)") ||
		strings.Contains(text, "not traced") || strings.Contains(text, "1 ranks") {
		t.Errorf("--rank 2's report:\n%s", text)
	}
	a, _ := tracetest.TwoNodes(t)
	_, text = textOf(t, a, Options{})
	if !strings.Contains(text, "Note: 2 ranks were not traced: 2, 3") {
		t.Errorf("node a's report:\n%s", text)
	}
}

// A node's trace cut short before the first failure seen: the failure is
// said to be the first seen, and the node named under it.
func TestJobCutShort(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	data, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	// Node a's trace cut after its allocations, before rank 1's failure.
	cut := filepath.Join(t.TempDir(), "a-cut.trace")
	for n := len(data) - 1; n > 0; n-- {
		if err := os.WriteFile(cut, data[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		if rep, err := Load(cut, Options{}); err == nil && len(rep.Failures) == 0 && len(rep.Processes) == 2 &&
			rep.Processes[1].Allocs == 2 {
			break
		}
	}
	var buf bytes.Buffer
	if _, err := merge.Write(&buf, []merge.Input{{Path: cut}, {Path: b}}, "t"); err != nil {
		t.Fatal(err)
	}
	job := filepath.Join(t.TempDir(), "job.trace")
	if err := os.WriteFile(job, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, text := textOf(t, job, Options{})
	f := rep.Jobs[0].FirstFailure
	if f == nil || len(f.CutShort) != 1 || f.CutShort[0].Host != "node-a" {
		t.Fatalf("first failure %+v", f)
	}
	if !strings.Contains(text, "First failure seen in the job: rank 2") ||
		!strings.Contains(text, "WARNING: the trace of node-a stops 2.5s into the trace, before this failure") {
		t.Errorf("text:\n%s", text)
	}
}

// jobProc is a process of a job: its PID, rank, and its environment's
// variables.
func jobProc(pid uint32, id, launcher string, rank, world int, start uint64, vars ...string) *tracefile.Process {
	return &tracefile.Process{PID: pid, Comm: "python3", Time: start + 1, Start: start,
		Job: &tracefile.Job{ID: id, Launcher: launcher, Rank: &rank, WorldSize: world, Vars: vars}}
}

func jobAlloc(at uint64, pid uint32, size uint64, result int32) events.Event {
	return events.Event{Time: at, Duration: 10, PID: pid, TID: pid, Comm: "python3", API: events.CudaMalloc,
		Addr: uint64(pid) << 32, Size: size, Result: result, Stack: []uint64{0x1100}}
}

// Jobs the environment tells apart badly: a rank two processes had (an
// sbatch without srun), two runs of a launcher that names no job (Hydra),
// torchrun's restarts of its workers; and ranks attached mid-run.
func TestJobsApart(t *testing.T) {
	const base = uint64(100 * time.Second)
	s := uint64(time.Second)
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", Host: "h", StartBoot: base, StartWall: tracetest.Wall},
		// sbatch without srun: both SLURM_PROCID 0 of one step.
		jobProc(10, "slurm:7", "slurm", 0, 1, base+1), jobProc(11, "slurm:7", "slurm", 0, 1, base+2),
		// Hydra, run twice: ranks 0 and 1 of size 2, twice.
		jobProc(20, "", "pmi", 0, 2, base+3), jobProc(21, "", "pmi", 1, 2, base+4),
		jobProc(22, "", "pmi", 0, 2, base+5*s), jobProc(23, "", "pmi", 1, 2, base+5*s+1),
		// torchrun: attempt 0, then its restart (attempt 1).
		jobProc(30, "torchrun:abc", "torchrun", 0, 2, base+6, "TORCHELASTIC_RESTART_COUNT=0"),
		jobProc(31, "torchrun:abc", "torchrun", 1, 2, base+7, "TORCHELASTIC_RESTART_COUNT=0"),
		jobProc(32, "torchrun:abc", "torchrun", 0, 2, base+8*s, "TORCHELASTIC_RESTART_COUNT=1"),
		jobProc(33, "torchrun:abc", "torchrun", 1, 2, base+8*s+1, "TORCHELASTIC_RESTART_COUNT=1"),
		// Attached: both started before the trace, rank 1 fails.
		jobProc(40, "mpi:9", "openmpi", 0, 2, base-10*s), jobProc(41, "mpi:9", "openmpi", 1, 2, base-10*s),
		jobAlloc(base+s, 10, 1<<20, 0), jobAlloc(base+s, 11, 1<<20, 0),
		jobAlloc(base+s, 20, 1<<20, 0), jobAlloc(base+s, 21, 1<<20, 0), jobAlloc(base+6*s, 22, 1<<20, 0), jobAlloc(base+6*s, 23, 1<<20, 0),
		jobAlloc(base+s, 30, 1<<20, 0), jobAlloc(base+s, 31, 1<<20, 0),
		jobAlloc(base+9*s, 32, 1<<20, 0), jobAlloc(base+9*s, 33, 1<<20, 0), jobAlloc(base+9*s+1, 33, 1<<30, 2),
		jobAlloc(base+s, 40, 1<<20, 0), jobAlloc(base+2*s, 41, 1<<40, 2),
		&tracefile.End{Time: base + 10*s})
	rep, text := textOf(t, path, Options{})
	ids := []string{}
	for _, j := range rep.Jobs {
		ids = append(ids, fmt.Sprintf("%s/%d/%d:%d", j.ID, attemptOr(j.Attempt), j.Unnamed, len(j.Ranks)))
	}
	if got := strings.Join(ids, " "); got != "/-1/1:2 /-1/2:2 mpi:9/-1/0:2 slurm:7/-1/0:2 torchrun:abc/0/0:2 torchrun:abc/1/0:2" {
		t.Errorf("jobs %s", got)
	}
	for _, want := range []string{
		"WARNING: rank 0 is 2 processes' (pids 10, 11)",
		"Job #1 without an ID (pmi ranks: their launcher sets none): 2 ranks of 2",
		"Job #2 without an ID (pmi ranks: their launcher sets none): 2 ranks of 2",
		"Job torchrun:abc, attempt 0: 2 ranks of 2",
		"Job torchrun:abc, attempt 1 (restarted once by torchrun): 2 ranks of 2",
		"Note: tracing began while their processes were running (2 of 2: attached): LIVE is what each made since; memory made before is not in it",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
	// The restart's failure: what its own attempt's workers held, not the
	// first attempt's ("no traced call yet").
	for _, j := range rep.Jobs {
		if j.ID == "torchrun:abc" && attemptOr(j.Attempt) == 1 {
			if f := j.FirstFailure; f == nil || len(f.Held) != 2 || f.Held[0].PID != 32 || f.Held[0].NotStarted {
				t.Errorf("attempt 1's failure %+v", f)
			}
		}
	}
	if strings.Contains(text, "a job no variable names") || strings.Contains(text, "4 ranks of 2") {
		t.Errorf("text:\n%s", text)
	}
}

// --min-age's leak candidates say which are pinned host memory, which
// LIVE does not count.
func TestLeaksSayHost(t *testing.T) {
	const base = uint64(100 * time.Second)
	s := uint64(time.Second)
	host := jobAlloc(base+s, 7, 4<<20, 0)
	host.API, host.Addr = events.CudaHostAlloc, 0x9000
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", Host: "h", StartBoot: base, StartWall: tracetest.Wall},
		&tracefile.Process{PID: 7, Comm: "train", Time: base}, jobAlloc(base+s, 7, 1<<20, 0), host,
		&tracefile.End{Time: base + 10*s})
	rep, text := textOf(t, path, Options{MinAge: time.Second})
	if len(rep.Leaks) != 2 || rep.Leaks[0].Host != true || rep.Leaks[1].Host {
		t.Errorf("leaks %+v", rep.Leaks)
	}
	if !strings.Contains(text, "[1] 4.0 MiB of pinned host memory in 1 allocation") || !strings.Contains(text, "[2] 1.0 MiB in 1 allocation") ||
		!strings.Contains(text, "not GPU memory: the process table's LIVE leaves it out") {
		t.Errorf("text:\n%s", text)
	}
}
