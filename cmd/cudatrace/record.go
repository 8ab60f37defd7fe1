package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/internal/outfile"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/report"
)

type recordFlags struct {
	traceFlags
	pids      pidList
	all       bool
	duration  time.Duration
	output    string
	window    string
	keepWin   bool
	portable  bool
	quiet     bool
	verbose   bool
	exports   []string // FORMAT=FILE
	nvmlEvery time.Duration
	budget    budgetFlags
}

func (f *recordFlags) bind(fl *pflag.FlagSet) {
	addPIDFlag(fl, &f.pids, "trace this running process (repeatable)")
	fl.BoolVarP(&f.all, "all", "a", false, "trace every process on the host")
	fl.DurationVarP(&f.duration, "duration", "d", 0, "stop after this long (e.g. 30s, 5m)")
	fl.StringVarP(&f.output, "output", "o", "", "write the trace to this file")
	fl.StringVar(&f.window, "stack-window", "16KiB", "user stack copied for an allocation whose stack BPF cannot unwind (see Stacks below), to unwind it here: a multiple of 4KiB up to 64KiB, 0 for frame-pointer stacks only")
	fl.BoolVar(&f.portable, "portable", false, "name every native frame into the trace while recording, so report/export name them on another machine, without these libraries (containers' frames are always named)")
	fl.BoolVar(&f.keepWin, "keep-stack-windows", false, "write the stack windows to the trace for report/export to unwind, instead of unwinding while recording (traces grow by the window per allocation)")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print no summary")
	fl.BoolVarP(&f.verbose, "verbose", "v", false, "also print what reading the events cost: process CPU per event and time per stage (decode, unwind, ledger, write...)")
	fl.StringArrayVar(&f.exports, "export", nil, "on stop, also write FORMAT=FILE ("+formatList()+"; repeatable)")
	f.add(fl, "name no frame while recording, not even a container's: the trace keeps addresses and mappings, report and export name them from the files they find (and --export writes addresses)",
		"sample the driver's per-process GPU memory (NVML) into the trace")
	fl.DurationVar(&f.nvmlEvery, "nvml-interval", record.DefaultNVMLEvery, "how often to sample NVML")
	f.budget.bind(fl)
	fl.SetInterspersed(false)
}

func runRecord(cmd *cobra.Command, f *recordFlags, args []string) error {
	if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
		return hint.Wrap(fmt.Errorf("unexpected argument %q", args[0]),
			"put the command to trace after --, e.g. cudatrace record -- "+strings.Join(args, " "))
	}
	window, err := parseWindow(f.window)
	if err != nil {
		return hint.Wrap(fmt.Errorf("--stack-window %q: %w", f.window, err),
			"e.g. --stack-window 32KiB for deep native stacks, or 0 to copy none")
	}
	ring, err := f.ring(window)
	if err != nil {
		return err
	}
	if f.noSymbolize && f.portable {
		return hint.Wrap(errors.New("--portable names every frame while recording, --no-symbolize none"), "pick one")
	}
	exports, err := parseExports(f.exports)
	if err != nil {
		return err
	}
	if err := f.budget.parse(); err != nil {
		return err
	}
	// Every output is checked before anything is traced: a typo or a
	// FIFO must not cost a whole training run.
	if f.output != "" {
		if err := outfile.Check(f.output); err != nil {
			return err
		}
	}
	for _, e := range exports {
		if err := outfile.Check(e.path); err != nil {
			return hint.Wrap(fmt.Errorf("--export %s=%s: %w", e.format, e.path, err), hint.Of(err))
		}
	}
	// So are the command and the processes: no probe is attached for a
	// typo.
	if err := checkTargets(args, f.pids); err != nil {
		return err
	}
	output := f.output
	var temp string // the trace made only for the exports: removed once they are written
	if output == "" && (len(exports) > 0 || f.budget.any()) {
		// The budgets' lines name stacks from the trace.
		tmp, err := os.CreateTemp("", "cudatrace-*.trace")
		if err != nil {
			return fmt.Errorf("create a trace file for --export or a budget: %w", err)
		}
		tmp.Close()
		output, temp = tmp.Name(), tmp.Name()
		defer func() {
			if temp != "" {
				os.Remove(temp)
			}
		}()
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	opts := record.Options{
		Libs: f.libs, PIDs: f.pids.ints(), All: f.all, Command: args,
		Duration: f.duration, Output: output, Version: version,
		Stderr:       cmd.ErrOrStderr(),
		LaunchHelper: []string{exe, launchCmdName},

		KeepStackWindows: f.keepWin,
		NoPythonFrames:   f.noPy,
		Portable:         f.portable,
		NoSymbolize:      f.noSymbolize,
		ReaderStats:      f.verbose,
		GCHeadroom:       recordGCHeadroom,
	}
	opts.Tracer.RingBytes = ring
	if f.nvml {
		if f.nvmlEvery < 10*time.Millisecond {
			return hint.Wrap(fmt.Errorf("--nvml-interval %s is too short", f.nvmlEvery), "e.g. --nvml-interval 1s")
		}
		opts.NVML, opts.NVMLEvery = gpustat.Open, f.nvmlEvery
	}
	opts.Tracer.StackWindow = window
	res, err := record.Run(cmd.Context(), opts)
	if res == nil {
		return err // nothing was traced
	}
	// From here on the command has run: its summary is printed whatever
	// became of the files, and the exit status says what did.
	w := cmd.ErrOrStderr()
	incomplete := err != nil
	if err != nil {
		printError(w, hint.Wrap(fmt.Errorf("the trace %s is incomplete: %w", output, err),
			"it is readable up to the last record written: free space and `cudatrace report` it"))
	}
	if !f.quiet {
		if err := report.WriteSummary(cmd.OutOrStdout(), res.Ledger, res.Lost-res.LostStopping, res.Captured); err != nil {
			printError(w, fmt.Errorf("summary: %w", err))
		}
	}
	writeLosses(w, "cudatrace", res, ring)
	if res.StacksCut > 0 {
		what := "stacks end where their"
		if res.StacksCut == 1 {
			what = "stack ends where its"
		}
		fmt.Fprintf(w, "cudatrace: %d %s %s stack window did; a larger --stack-window (up to 64KiB) reaches deeper\n",
			res.StacksCut, what, f.window)
	}
	writePythonLosses(w, "cudatrace", res)
	if res.Reader != nil {
		res.Reader.Write(w)
	}
	if f.output != "" && !incomplete {
		fmt.Fprintf(w, "cudatrace: %d events written to %s; see `cudatrace report %s`\n", res.Events, f.output, f.output)
	}
	exportFailed := false
	for _, e := range exports {
		if err := writeExport(cmd.OutOrStdout(), output, e.format, e.path, export.Options{NoSymbolize: f.noSymbolize}); err != nil {
			printError(w, err)
			exportFailed = true
			continue
		}
		fmt.Fprintf(w, "cudatrace: %s written to %s\n", e.format, e.path)
	}
	if exportFailed && temp != "" {
		// Nothing recorded is lost because an export failed.
		fmt.Fprintf(w, "cudatrace: the trace is kept in %s: `cudatrace export %s --format FORMAT -o FILE` writes it again\n", temp, temp)
		temp = ""
	}
	overBudget := f.budget.any() && f.budget.check(w, res.Ledger, output)
	switch {
	case res.ExitCode != 0:
		return exitError{code: exitCode(res.ExitCode)}
	case incomplete || exportFailed:
		return exitError{code: exitRecordingFailed}
	case overBudget:
		return exitError{code: exitOverBudget}
	}
	return nil
}

// exitRecordingFailed is record's exit status when the command succeeded
// (or none was launched) but the trace or an export could not be written
// whole, as timeout(1) and env(1) keep 125 for their own failures.
const exitRecordingFailed = 125

type exportTarget struct {
	format export.Format
	path   string
}

// parseExports checks --export values before anything is traced: a typo
// must not cost a whole training run.
func parseExports(specs []string) ([]exportTarget, error) {
	var out []exportTarget
	for _, spec := range specs {
		name, path, ok := strings.Cut(spec, "=")
		if !ok || path == "" {
			return nil, hint.Wrap(fmt.Errorf("--export %q: want FORMAT=FILE", spec), "e.g. --export pprof=train.pb.gz")
		}
		format, err := export.ParseFormat(name)
		if err != nil {
			return nil, hint.Wrap(fmt.Errorf("--export %q: %w", spec, err), "e.g. --export pprof=train.pb.gz")
		}
		out = append(out, exportTarget{format, path})
	}
	return out, nil
}

func exitCode(c int) int {
	if c < 0 || c > 255 {
		return 1
	}
	return c
}

// checkRing refuses a --ring-size that holds too few allocation records of
// the stack window's size: every burst of them would be lost.
func checkRing(ring uint32, flag string, window int) error {
	if err := loader.CheckRing(ring, window); err != nil {
		return hint.Wrap(fmt.Errorf("--ring-size %s: %w", flag, err),
			fmt.Sprintf("e.g. --ring-size %dKiB, or a smaller --stack-window", loader.MinRingBytes(window)>>10))
	}
	return nil
}

// parseWindow reads --stack-window: 0, or a multiple of 4 KiB up to
// loader.MaxStackWindow. 0 becomes the loader's "none".
func parseWindow(s string) (int, error) {
	v, err := parseBytes(s)
	if err != nil {
		return 0, err
	}
	if v%4096 != 0 || v > loader.MaxStackWindow {
		return 0, fmt.Errorf("must be 0 or a multiple of 4KiB up to %dKiB", loader.MaxStackWindow>>10)
	}
	if v == 0 {
		return -1, nil
	}
	return int(v), nil
}

// parseSize reads a byte count with an optional K/M/G (or KiB/MiB/GiB)
// suffix, 1024-based, and requires a power of two of at least a page.
func parseSize(s string) (uint32, error) {
	v, err := parseBytes(s)
	if err != nil {
		return 0, err
	}
	page := uint64(os.Getpagesize())
	if v < page || v > loader.MaxRingBytes || v&(v-1) != 0 {
		return 0, fmt.Errorf("must be a power of two between %d bytes and %dGiB", page, loader.MaxRingBytes>>30)
	}
	return uint32(v), nil
}

// parseBytes reads a byte count with an optional K/M/G (or KiB/MiB/GiB)
// suffix, 1024-based.
func parseBytes(s string) (uint64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := uint64(1)
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			mult, t = 1<<10, t[:n-1]
		case 'M':
			mult, t = 1<<20, t[:n-1]
		case 'G':
			mult, t = 1<<30, t[:n-1]
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, errors.New("not a size")
	}
	if v > 1<<40 {
		return 0, errors.New("too large")
	}
	return v * mult, nil
}

// newRecordCmd is `cudatrace record`: its help, its flags (recordFlags.bind) and runRecord.
func newRecordCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "record [flags] (-- COMMAND [ARGS...] | --pid PID... | --all)",
		Short: "Trace the GPU memory allocations of a command, running processes, or the whole host",
		Long: `Record attaches uprobes to the CUDA runtime (libcudart) and driver (libcuda)
and traces every allocation and free: cudaMalloc, cudaFree, cudaMallocAsync,
cudaFreeAsync, cudaMallocFromPoolAsync, cudaMallocManaged, cudaMallocPitch,
cudaMalloc3D, cudaMallocHost, cudaHostAlloc, cudaFreeHost, and their driver
counterparts (cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync, ...), failed
calls included, each with its user stack. A runtime call that reaches the
driver on the same thread counts once.

What to trace (one of):
  -- COMMAND ARGS   launch COMMAND and trace it and its children from their
                    first instruction; recording ends when it exits, and
                    cudatrace exits with its exit status (128 + N when
                    signal N killed it)
  --pid PID         attach to a running process (repeatable); recording ends
                    when every one has exited
  --all             every process on the host; ends on Ctrl-C or --duration

Libraries: without --lib, cudatrace probes the libcudart and libcuda the
target has mapped (--pid), or every one in the ld.so cache, CUDA toolkit
directories and pip/conda layouts (a command, --all). A probe sits on the
library file, so processes that load it later are covered too; another
copy of the library (a virtualenv's wheel, a container) is another file:
the traced processes' mappings (with --all, every process's) are searched
for copies loaded later, which are then attached; --lib names one up front.

On stop (the targets exit, --duration, Ctrl-C or SIGTERM) it prints a
summary per process; -o keeps the full trace for 'cudatrace report' and
'cudatrace export', and --export writes an export at once (pprof, memviz,
perfetto or json; see 'cudatrace export --help').
A command still running when recording stops gets SIGTERM after 2 seconds.

Outputs (-o, --export) are checked before anything is traced. They are
created 0600 (they hold command lines and stacks), an existing file keeps
its mode, a link is followed to the file it names, and a device, FIFO,
socket or directory is refused. If the trace cannot be written whole (disk
full) the summary is still printed; if an export fails, the trace it was
made from is kept and its path printed.

Budgets, for CI: --max-peak SIZE and --max-live-at-exit SIZE (as 512MiB,
8GiB) hold each traced process's GPU memory (device and managed, as the
report's PEAK and LIVE count it) at its peak, and at its end (its exit, or
the stop), to SIZE. A process over one gets a line saying which budget,
by how much, and the stacks that held the memory then.

Exit status: the command's; 125 when it succeeded (or none was launched)
but the trace or an export was not written whole; 122 when all that went
well but a process was over a budget; 1 when tracing could not start.

Nothing traced is ever stopped or waited for: a process's mappings are
read at its first allocation while it runs on, and each Python code object
is copied by the probe the first time a stack shows it. What cannot be
read in time (a process gone before its mappings were read, a library
mapped before its probes were attached) is counted and said.

NVML: every second (--nvml-interval), record also asks the NVIDIA driver (NVML, as nvidia-smi
does) how much GPU memory each process holds, and keeps that in the trace:
'cudatrace report' puts it beside the traced live bytes, and the remainder
is what tracing did not see (the CUDA context, library workspaces). Without
NVML (no libnvidia-ml, or no driver loaded) one line says so and tracing
goes on; --nvml=false turns the sampling off.

Stacks: each allocation's native stack is unwound in the kernel (BPF),
from the call-frame rules (.eh_frame) of the files the process mapped,
made as it first allocates; code with or without frame pointers, a record
of frames only. Where BPF cannot (a process's first allocations before its
files' rules are in, a library loaded a moment ago, a signal frame), that
allocation's user stack is copied instead (--stack-window) and unwound
here; how many, and why, the trace counts ('cudatrace report --json':
.counters.unwound_in_bpf, unwind_fallback_no_rules, unwind_fallback_rule).
CUDATRACE_UNWIND=window copies the window for every allocation, the way
before.

Stacks are named (function, file:line) when report or export reads the
trace, from the files the processes mapped, checked by build ID. A
container's files are read while it runs and its frames named into the
trace, since the host may hold other builds at the same paths; --portable
does the same for every process, for a trace read on another machine;
--no-symbolize names none, not even a container's (the trace keeps the
addresses and mappings; report and export name what they can).`,
		Example: `  # Launch a training script and keep the trace
  cudatrace record -o train.trace -- python train.py --epochs 1

  # Keep the trace, and write a pprof profile and a memory_viz snapshot on stop
  cudatrace record -o train.trace --export pprof=train.pb.gz --export memviz=train.pickle -- python train.py

  # In CI: fail (exit 122) when the job's GPU memory peaks above 6GiB or
  # it still holds more than 64MiB when it exits
  cudatrace record --max-peak 6GiB --max-live-at-exit 64MiB -- python -m pytest tests/gpu

  # Attach to a running job for one minute
  cudatrace record --pid 4242 --duration 1m -o job.trace

  # A trace to read on a laptop: the frames are named while recording
  cudatrace record --portable -o job.trace -- python train.py

  # Everything on the host that uses a given libcudart, until Ctrl-C
  cudatrace record --all --lib /opt/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12`,
	}, (*recordFlags).bind, runRecord)
}

// recordGCHeadroom is how much more memory than Go's default target
// `record` lets its garbage collector use, to collect less often while
// the events come (record.Options.GCHeadroom): the reader's CPU per event
// is what a recording costs the host beside the job.
const recordGCHeadroom = 256 << 20
