package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/report"
)

type reportFlags struct {
	readFlags
	json     bool
	minAge   time.Duration
	interval time.Duration
	by       string
}

func (f *reportFlags) bind(fl *pflag.FlagSet) {
	fl.BoolVar(&f.json, "json", false, "print the report as JSON")
	f.add(fl, "how many stacks to show in the text report (and per process at the peak)")
	fl.DurationVar(&f.minAge, "min-age", 0, "list leak candidates: live at the end and at least this old (e.g. 30s)")
	fl.DurationVar(&f.interval, "interval", 0, "add a table of used and peaked GPU memory per interval (e.g. 10s); with --by, bytes added and removed per interval and row")
	fl.StringVar(&f.by, "by", "", "add a view by function or by line (Python lines where the stacks have any, else native file:line): tensor bytes used, segment bytes acquired, occurrences")
}

func runReport(cmd *cobra.Command, f *reportFlags, args []string) error {
	if err := f.check(); err != nil {
		return err
	}
	if err := nonNegative("min-age", f.minAge, f.minAge < 0); err != nil {
		return err
	}
	if err := nonNegative("interval", f.interval, f.interval < 0); err != nil {
		return err
	}
	by, err := report.ParseBy(f.by)
	if err != nil {
		return hint.Wrap(err, "e.g. --by function")
	}
	if err := checkTrace(args[0]); err != nil {
		return err
	}
	pids, err := f.selection(args[0])
	if err != nil {
		return hint.Default(err, traceHint)
	}
	opts := report.Options{Top: f.top, MinAge: f.minAge, Interval: f.interval, PIDs: pids,
		NoSymbolize: f.noSymbolize, By: by}
	rep, err := report.Load(args[0], opts)
	if err != nil {
		return hint.Default(err, traceHint)
	}
	if f.json { // the text report carries them itself
		for _, w := range []string{rep.Warning, rep.SymbolWarning} {
			if w != "" {
				cmd.PrintErrf("cudatrace: warning: %s\n", w)
			}
		}
	}
	if f.json {
		return rep.WriteJSON(cmd.OutOrStdout())
	}
	if err := rep.WriteText(cmd.OutOrStdout()); err != nil {
		return err
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "\n%s\n", pageHint(args[0]))
	return err
}

// pageHint says how to see a trace as the HTML page: memory over time,
// flame graphs at any moment, a range's leaks.
func pageHint(trace string) string {
	return fmt.Sprintf("To look at it: cudatrace export %s --format html -o report.html, and open report.html in a browser "+
		"(memory over time, the live set at any moment as a flame graph, leaks by time range; no network needed)", trace)
}

// newReportCmd is `cudatrace report`: its help, its flags (reportFlags.bind) and runReport.
func newReportCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "report TRACE",
		Short: "Summarize a trace: memory per process and device, top allocation stacks, failures",
		Long: `Report reads a trace written by 'cudatrace record -o' and prints, per process,
allocation and free counts, bytes allocated, GPU memory live at the end and
at its peak (per device), pinned host memory, the call stacks that allocated
the most memory still live, the stacks that held each process's memory at
its peak, and every failed allocation with its CUDA error and what the
process and its device held at that moment.

"Where the GPU memory went" charges each process's GPU memory, per device,
live at the end and at its peak, to the component that asked for it: the
innermost frame of its stack in a file one of these rules names decides:
PyTorch's caching allocator (libc10_cuda.so), NCCL (libnccl.so*), cuBLAS
(libcublas*.so*), cuDNN (libcudnn*.so*), XLA (xla_extension.so, libxla*,
xla_cuda_plugin.so, jaxlib/, jax_plugins/), CuPy (cupy/, cupy_backends/),
Numba (Python frames in numba/cuda/), TensorFlow (libtensorflow*,
_pywrap_tensorflow*), TensorRT (libnvinfer*); else the application, named
by the file of the innermost frame outside CUDA's own libraries. With NVML
samples, "context, modules and untraced" is the driver's figure less all
of them.

--min-age lists leak candidates: allocations still live at the end that are
at least that old, grouped by stack (as bcc's memleak does). --interval adds
a table per process, device and interval of the change in live bytes (USED)
and how far above it memory rose in between (PEAKED), the columns fastai's
PeakMemMetric prints per epoch.

When the trace has NVML samples (record takes one a second), a table puts
beside each process the GPU memory the driver charged it (NVML-USED, what
nvidia-smi shows) and what cudatrace saw live at that moment (TRACED). The
REMAINDER is what tracing did not see: the CUDA context, cuBLAS/cuDNN
workspaces, a library that was not probed. Its FIRST, MIN, MAX and DRIFT
over the samples tell a constant overhead from a growing one; --interval
adds the remainder per interval. NVML's device indices are not CUDA's
ordinals, so the comparison is per process, over all its GPUs.

Processes of a distributed job (torchrun, Slurm, MPI, JobSet, Ray: the job and
rank their launcher's environment gave them) are shown with their JOB and RANK,
grouped by job; per job, a table of its ranks' peak and end memory, how
unevenly they peaked, and the first failed allocation in the job (rank, node,
time, stack) with what every rank held then. --rank N reports those ranks
only. A trace of several nodes (cudatrace merge) adds NODE, and says how well
the nodes' clocks agreed. docs/jobs.md says more.

Stacks are symbolized from the libraries and executables on this machine,
checked against the build IDs captured while recording. A trace cut short
(the tracer was killed) is reported up to its last complete record.`,
		Example: `  cudatrace report train.trace
  cudatrace report train.trace --top 5
  cudatrace report train.trace --min-age 30s     # what was allocated long ago and never freed
  cudatrace report train.trace --interval 10s    # used and peaked per 10 seconds
  cudatrace report train.trace --by function     # used/acquired/occurrences per function (CupyMemoryProfileHook)
  cudatrace report train.trace --by line --interval 10s  # bytes added and removed per source line (MemTracker)
  cudatrace report train.trace --json | jq '.processes[] | {pid, live_bytes, peak_bytes}'
  cudatrace report train.trace --json | jq '.owners[] | {pid, peak}'   # who held the memory at the peak
  cudatrace report job.trace --rank 0 --rank 3                # two ranks of a job
  cudatrace report job.trace --json | jq '.jobs[].first_failure | {rank, node, time}'
  cudatrace export train.trace --format html -o train.html   # the same, as a page to look at`,
		Args: oneTrace,
	}, (*reportFlags).bind, runReport)
}
