package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/record"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries an exit code without an error message: `record` exits
// with its command's code.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// run is main without os.Exit, so deferred cleanup (detaching probes,
// closing the trace) always runs before the process ends.
func run(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot(os.Stdout, os.Stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	}
	printError(os.Stderr, err)
	return 1
}

func printError(w io.Writer, err error) {
	fmt.Fprintf(w, "cudatrace: %v\n", err)
	if h := hint.Of(err); h != "" {
		fmt.Fprintf(w, "  hint: %s\n", h)
	}
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "cudatrace",
		Short: "Trace GPU memory allocations of CUDA programs, from outside them",
		Long: `cudatrace records every GPU memory allocation and free a CUDA program makes
(cudaMalloc, cudaFree, async, managed, pitched, pinned host memory) with eBPF
uprobes on the CUDA libraries: no code change, no restart, any framework.
Each event carries the process, thread, device, size, address, CUDA result
and the user stack, so you can answer who allocated what, from where, when,
what is still live and what failed.

Record a trace, then report on it:

  cudatrace record -o train.trace -- python train.py
  cudatrace report train.trace
  cudatrace export train.trace --format pprof -o train.pb.gz

Needs root, or CAP_BPF and CAP_PERFMON, on Linux 5.15 or later with BTF.`,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(flagError)
	root.AddCommand(newRecordCmd(), newReportCmd(), newDiffCmd(), newExportCmd(), newMergeCmd(), newTopCmd(), newAgentCmd(), newLaunchCmd())
	return root
}

// writeLosses warns of the events a session lost, those while tracing
// (with their causes and remedy, from the ring buffer's size ring) apart
// from those while stopping, which change none of the figures up to the
// stop.
func writeLosses(w io.Writer, who string, res *record.Result, ring uint32) {
	if n := res.Lost - res.LostStopping; n > 0 {
		causes := res.CountersAtStop
		if causes == nil {
			causes = res.Counters
		}
		fmt.Fprintf(w, "%s: warning: %d events lost while tracing: %s\n", who, n, loader.LossHint(causes, ring, res.ReaderRaised))
	}
	if n := res.Counters["ringbuf_no_window"]; n > 0 {
		fmt.Fprintf(w, "%s: %s\n", who, loader.NoWindowHint(n, ring))
	}
	if res.LostStopping > 0 {
		fmt.Fprintf(w, "%s: %d events lost while stopping (probes firing as they were removed): the figures up to the stop miss none of them\n",
			who, res.LostStopping)
	}
}

// writePythonLosses says what of the traced processes could not be named:
// Python frames left unresolved, and processes gone before their mappings
// were read (their native frames stay addresses).
func writePythonLosses(w io.Writer, who string, res *record.Result) {
	if res.UnresolvedPython > 0 {
		fmt.Fprintf(w, "%s: %d of %d Python frames stayed unresolved (their code objects were neither captured at first sight nor readable after): shown as [unresolved Python frame]\n",
			who, res.UnresolvedPython, res.PythonFrames)
	}
	if res.PythonNoInterp > 0 {
		fmt.Fprintf(w, "%s: %d allocations have no Python frames: their processes ended before their interpreter could be read, and their frames cannot be named without it\n", who, res.PythonNoInterp)
	}
	if res.PythonUnwalked > 0 {
		fmt.Fprintf(w, "%s: %d allocations have no Python frames: their processes made them before cudatrace had read their interpreter (it was behind; a process in a root of its own may have ended, root and all, before it could be read)\n", who, res.PythonUnwalked)
	}
	if n := res.Counters["python_preempted"]; n > 0 {
		fmt.Fprintf(w, "%s: %d allocations have no Python frames: a thread that preempted the probe on its CPU took the scratch they were built in\n", who, n)
	}
	if n := res.Counters["map_full"] + res.MapsFull; n > 0 {
		fmt.Fprintf(w, "%s: %d times a BPF map kept per process was full of living processes' entries: those processes' Python frames (or a child's tracing) were left out\n", who, n)
	}
	if res.ExitsSwept > 0 {
		fmt.Fprintf(w, "%s: %d process ends (or their BPF entries) were found by the sweep, not by the kernel's exit record (lost with a full ring buffer): what they held is counted as held at exit from then\n", who, res.ExitsSwept)
	}
	switch {
	case res.Uncaptured == 1:
		fmt.Fprintf(w, "%s: 1 process exited before its mappings could be read: its native frames stay addresses\n", who)
	case res.Uncaptured > 1:
		fmt.Fprintf(w, "%s: %d processes exited before their mappings could be read: their native frames stay addresses\n", who, res.Uncaptured)
	}
}
