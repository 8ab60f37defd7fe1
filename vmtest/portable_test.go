package vmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPortableTrace: record --portable names every native frame into the
// trace while the process runs, so that report names its stack where the
// files it ran are not (another machine: here they are moved away before
// report runs); the same run recorded without it has no names there.
func TestPortableTrace(t *testing.T) {
	ctx, dir := traceSetup(t)
	requireTool(t, "gcc")
	app, _ := buildContainer(t, dir) // only the host's build is run
	want := []string{
		frameString("host_alloc", "ctr_work.c", markedLine(t, "ctr_work.c", "host_alloc")),
		frameString("work", "ctr_work.c", markedLine(t, "ctr_work.c", "work")),
		frameString("main", "ctr_main.c", markedLine(t, "ctr_main.c", "main")),
	}
	type run struct {
		trace string
		pid   int
	}
	runs := map[bool]run{}
	for _, portable := range []bool{true, false} {
		name := map[bool]string{true: "portable", false: "plain"}[portable]
		log, trace := filepath.Join(dir, name+".log"), filepath.Join(dir, name+".trace")
		args := []string{"--lib", fakeLib, "-o", trace}
		if portable {
			args = append(args, "--portable")
		}
		args = append(args, "--", "sh", "-c", "printf 'go\\nbye\\n' | "+filepath.Join(app, "ctrmain"))
		rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, args...)
		rec.finish(t, 30*time.Second)
		truth := onlyTruth(t, log, "")
		if truth.Allocs != 1 {
			t.Fatalf("%s: ground truth %d allocations, want 1", name, truth.Allocs)
		}
		runs[portable] = run{trace, truth.PID}

		// On this machine, with the files in place, both are named.
		if got, _ := pidStack(t, runReport(t, ctx, trace), truth.PID); len(got) < len(want) ||
			strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s, files in place: stack %q, want %q first", name, got, want)
		}
	}

	// The machine the trace is read on has none of the files.
	if err := os.Rename(app, app+".elsewhere"); err != nil {
		t.Fatal(err)
	}
	got, module := pidStack(t, runReport(t, ctx, runs[true].trace), runs[true].pid)
	if len(got) < len(want) || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
		t.Errorf("--portable, files gone: stack %q, want %q first", got, want)
	}
	if lib := filepath.Join(app, "libwork.so"); module != lib {
		t.Errorf("--portable, files gone: innermost module %q, want %q", module, lib)
	}
	got, _ = pidStack(t, runReport(t, ctx, runs[false].trace), runs[false].pid)
	if len(got) < len(want) {
		t.Fatalf("without --portable, files gone: stack %q, want %d frames as unwound while recording", got, len(want))
	}
	for _, f := range got[:len(want)] {
		if f != "" && !strings.HasPrefix(f, "0x") {
			t.Errorf("without --portable, files gone: frame %q is named, want the trace to hold no names (stack %q)", f, got)
		}
	}
}

// TestPortableExiting: record --portable of processes that exit right
// after allocating, run again and again: each one's libraries are read
// while it exits, and a read that fails then (the process gone from
// /proc) must not stand for its file's build ID later. In every run,
// every process's stack is named from the trace alone (the files moved
// away before report runs).
func TestPortableExiting(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "gcc")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	app, _ := buildContainer(t, dir)
	want := []string{
		frameString("host_alloc", "ctr_work.c", markedLine(t, "ctr_work.c", "host_alloc")),
		frameString("work", "ctr_work.c", markedLine(t, "ctr_work.c", "work")),
		frameString("main", "ctr_main.c", markedLine(t, "ctr_main.c", "main")),
	}
	const runs, procs = 10, 3
	for run := range runs {
		log, trace := filepath.Join(dir, fmt.Sprintf("%d.log", run)), filepath.Join(dir, fmt.Sprintf("%d.trace", run))
		loop := fmt.Sprintf("for i in $(seq %d); do printf 'go\\nbye\\n' | %s; done", procs, filepath.Join(app, "ctrmain"))
		rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "--lib", fakeLib, "-o", trace, "--portable", "--", "sh", "-c", loop)
		rec.finish(t, 30*time.Second)
		truths, err := groundTruthFile(log, "")
		if err != nil || len(truths) != procs {
			t.Fatalf("run %d: ground truth of %d processes (%v), want %d", run, len(truths), err, procs)
		}
		if err := os.Rename(app, app+".elsewhere"); err != nil {
			t.Fatal(err)
		}
		rep := runReport(t, ctx, trace)
		if err := os.Rename(app+".elsewhere", app); err != nil {
			t.Fatal(err)
		}
		for pid := range truths {
			got, module := pidStack(t, rep, pid)
			if len(got) < len(want) || strings.Join(got[:len(want)], "\n") != strings.Join(want, "\n") {
				t.Errorf("run %d, pid %d (files gone): stack %q, want %q first", run, pid, got, want)
			}
			if lib := filepath.Join(app, "libwork.so"); module != lib {
				t.Errorf("run %d, pid %d: innermost module %q, want %q", run, pid, module, lib)
			}
		}
	}
}
