package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/top"
)

type topFlags struct {
	traceFlags
	pids   pidList
	every  time.Duration
	stacks int
}

func (f *topFlags) bind(fl *pflag.FlagSet) {
	addPIDFlag(fl, &f.pids, "watch this process only (repeatable); default: every process")
	fl.DurationVarP(&f.every, "interval", "i", time.Second, "refresh interval (and NVML sampling)")
	fl.IntVar(&f.stacks, "top", 5, "how many stacks of the selected process to show")
	fl.IntVar(&f.stacks, "stacks", 5, "how many stacks of the selected process to show")
	_ = fl.MarkDeprecated("stacks", "use --top, as report does")
	f.add(fl, "show stack addresses only", "compare with the driver's per-process figure (NVML)")
}

func runTop(cmd *cobra.Command, f *topFlags, _ []string) error {
	if f.every < 10*time.Millisecond {
		return hint.Wrap(fmt.Errorf("--interval %s is too short", f.every), "e.g. --interval 1s")
	}
	if f.stacks < 0 {
		return hint.Wrap(fmt.Errorf("--top %d: must be 0 or more", f.stacks), "e.g. --top 5")
	}
	ring, err := f.ring(loader.DefaultStackWindow)
	if err != nil {
		return err
	}
	if err := checkTargets(nil, f.pids); err != nil {
		return err
	}
	c := top.NewCollector(f.every, f.stacks, f.pids.ints())
	topts := top.Options{Every: f.every, In: os.Stdin, Out: os.Stdout, NoSymbolize: f.noSymbolize, NoNVML: !f.nvml,
		Target: "all processes"}
	if len(f.pids) > 0 {
		var ps []string
		for _, p := range f.pids {
			ps = append(ps, fmt.Sprint(p))
		}
		topts.Target = "pid " + strings.Join(ps, ", ")
	}
	stderr := cmd.ErrOrStderr()
	if topts.Interactive() {
		// The screen is taken: the tracer's lines go to the status line.
		topts.Messages = &top.Messages{}
		stderr = topts.Messages
	}
	opts := record.Options{Libs: f.libs, PIDs: f.pids.ints(), All: len(f.pids) == 0, Version: version,
		Stderr: stderr, Observer: c, NVMLEvery: f.every, NoPythonFrames: f.noPy}
	opts.Tracer.PollInterval = min(f.every/2, 50*time.Millisecond)
	opts.Tracer.RingBytes = ring
	if f.nvml {
		opts.NVML = gpustat.Open
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	stop := make(chan top.Stop, 1)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		res, err := record.Run(ctx, opts)
		st := top.Stop{Err: err}
		if res != nil {
			st.Reason = res.StopReason
			c.Flush(res)
		}
		stop <- st
	}()
	err = top.Run(ctx, c, topts, stop)
	cancel()
	// The probes are detached before top exits; with many of them that
	// takes seconds, and the terminal is already the user's again.
	select {
	case <-finished:
	case <-time.After(300 * time.Millisecond):
		fmt.Fprintln(cmd.ErrOrStderr(), "cudatrace: detaching probes...")
		<-finished
	}
	return err
}

// newTopCmd is `cudatrace top`: its help, its flags (topFlags.bind) and runTop.
func newTopCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "top [--pid PID...]",
		Short: "Watch GPU memory live: per process and device, traced beside the driver's figure, with the top stacks",
		Long: `Top traces every process on the host (or the --pid ones) and shows, refreshed
every --interval, per GPU and per process: the GPU memory cudatrace sees live
(LIVE) and its peak, what the NVIDIA driver charges the process (NVML-USED,
as nvidia-smi shows it), the REMAINDER between the two (the CUDA context,
library workspaces, anything not traced), and the allocation rate since the
last refresh, and the owner holding most of its memory (MOST BY: pytorch,
nccl, cublas, ... application, as 'cudatrace report' says them; the selected
process's owners are listed under the table). Under the table, the selected process's call stacks holding
the most live memory, symbolized; a CPython (` + pystack.Versions() + `) process's with its
Python frames (file:line) in place of the interpreter loop's.

Keys: q or Ctrl-C quits; j/k or the arrow keys select a process.

When stdout is not a terminal, top prints plain lines instead, one per
process and per GPU at each refresh, key=value with exact byte counts:

  2026-01-02T15:04:05Z pid=4242 comm="python3" live=1073741824 peak=... nvml_used=1384120320 remainder=310378496 ...

Only what happens after top starts is seen: memory a process allocated
before is not in LIVE (it is in NVML-USED, hence in the REMAINDER). A
process NVML lists that made no traced call is shown too, with all of its
memory as the remainder.`,
		Example: `  # Every process on the host
  sudo cudatrace top

  # One training job, refreshed twice a second
  sudo cudatrace top --pid 4242 --interval 500ms

  # Log a line per process every 10 s
  sudo cudatrace top --interval 10s > gpu-memory.log`,
		Args: cobra.NoArgs,
	}, (*topFlags).bind, runTop)
}
