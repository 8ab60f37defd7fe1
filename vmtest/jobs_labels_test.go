package vmtest

// Issue 40's jobs, with a real mpirun: ranks attached mid-run (what each
// held when rank 3 ran out says memory made before the attach is not in
// it), --rank 2 (the other ranks traced, only left out), --job of a job
// the trace lacks, the same trace merged twice (refused), and the pprof
// profile's documented filter, go tool pprof -tagfocus rank=3.
// Privileged.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestJobLabelsMpirun(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "mpirun")
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "job.trace")
	ranks := []int{0, 1, 2, 3}
	// The job runs first; tracing attaches once every rank has allocated.
	// Then every rank runs out (rankjob's FAIL list): a traced call each,
	// the first of them the job's first failure, when each held what it
	// made before the attach, which no traced figure has.
	job := exec.CommandContext(ctx, "mpirun", "--oversubscribe", "-np", "4", workload("rankjob"), dir, "0", "1", "2", "3")
	job.Env = append(fakeEnv(log), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	job.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	job.Cancel = func() error { return syscall.Kill(-job.Process.Pid, syscall.SIGKILL) }
	jobOut := newLockedBuffer("")
	job.Stdout, job.Stderr = jobOut, jobOut
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-job.Process.Pid, syscall.SIGKILL) })
	pids := waitReady(t, dir, ranks)
	args := []string{"--lib", fakeLib, "-o", trace}
	for _, r := range ranks {
		args = append(args, "--pid", strconv.Itoa(pids[r]))
	}
	rec := startRecord(t, ctx, recordOpts{}, args...)
	rec.waitAttached(t, 30*time.Second)
	letGo(t, dir, ranks...)
	if err := job.Wait(); err != nil {
		t.Logf("mpirun: %v\n%s", err, jobOut.String())
	}
	rec.finish(t, 30*time.Second)

	text := string(cudatrace(t, ctx, "report", trace))
	for _, want := range []string{
		"First failure in the job: rank ",
		"Note: tracing began while their processes were running (4 of 4: attached): LIVE is what each made since; memory made before is not in it",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("report lacks %q:\n%s", want, truncate(text, 16<<10))
		}
	}
	one := string(cudatrace(t, ctx, "report", trace, "--rank", "2"))
	if !strings.Contains(one, ": 1 rank shown of the 4 traced, world size 4 (the others left out by --rank or --pid)") ||
		strings.Contains(one, "not traced") || strings.Contains(one, "1 ranks") {
		t.Errorf("report --rank 2:\n%s", truncate(one, 16<<10))
	}
	out, err := exec.CommandContext(ctx, tracerBin, "report", trace, "--rank", "1", "--job", "nope").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--job nope: no such job in the trace") {
		t.Errorf("report --job nope: %v\n%s", err, out)
	}
	out, err = exec.CommandContext(ctx, tracerBin, "merge", trace, trace, "-o", filepath.Join(dir, "twice.trace")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "are the same trace") {
		t.Errorf("merge of one trace twice: %v\n%s", err, out)
	}
	// The documented filter keeps rank 3's samples, and only them: a job
	// traced from its start (mpirun under record).
	dir2 := filepath.Join(dir, "whole")
	if err := os.Mkdir(dir2, 0o755); err != nil {
		t.Fatal(err)
	}
	whole := filepath.Join(dir, "whole.trace")
	rec = startRecord(t, ctx, recordOpts{Env: append(fakeEnv(filepath.Join(dir, "whole.log")), "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")},
		"--lib", fakeLib, "-o", whole, "--", "mpirun", "--oversubscribe", "-np", "4", workload("rankjob"), dir2)
	waitReady(t, dir2, ranks)
	letGo(t, dir2, ranks...)
	rec.finish(t, 50*time.Second)
	prof := filepath.Join(dir, "job.pb.gz")
	cudatrace(t, ctx, "export", whole, "-f", "pprof", "-o", prof)
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command for go tool pprof")
	}
	// Rank 3, or the last rank the report names (the tracer reads each
	// rank's environment as it can: one it could not read has no rank).
	rank := -1
	if jobs := jobsOf(t, ctx, whole).Jobs; len(jobs) == 1 && len(jobs[0].Ranks) > 0 {
		rank = jobs[0].Ranks[len(jobs[0].Ranks)-1].Rank
	}
	if rank != 3 {
		t.Logf("the report names ranks up to %d: rank 3's environment was not read", rank)
	}
	if rank < 0 {
		t.Fatal("no rank in the report")
	}
	want := strconv.Itoa(rank)
	out, err = exec.CommandContext(ctx, gobin, "tool", "pprof", "-tagfocus", "rank="+want, "-sample_index=alloc_space", "-traces", prof).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof: %v\n%s", err, out)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "rank:" {
			n++
			if f[1] != want {
				t.Errorf("-tagfocus rank=%s kept a sample of rank %s", want, f[1])
			}
		}
	}
	if n == 0 {
		t.Errorf("-tagfocus rank=%s kept no sample:\n%s", want, out)
	}
	_ = os.Remove(prof)
}
