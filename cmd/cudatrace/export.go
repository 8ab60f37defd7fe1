package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/internal/outfile"
)

type exportFlags struct {
	readFlags
	format  string
	output  string
	at      string
	entries int
	otlpFlags
}

func (f *exportFlags) bind(fl *pflag.FlagSet) {
	fl.StringVarP(&f.format, "format", "f", "", "output format: "+formatList())
	fl.StringVarP(&f.output, "output", "o", "", "write to this file, created 0600 or replaced keeping its mode; a link is followed; never a device, FIFO, socket or directory (- for standard output)")
	fl.StringVar(&f.at, "at", "end", "the moment whose live set pprof and memviz show: end, peak, or a time since the start (90s)")
	f.add(fl, "json: how many stacks per process at the peak")
	fl.IntVar(&f.entries, "memviz-entries", export.DefaultMemvizEntries, "memviz: keep each device's latest N trace entries (0: none, the segments alone; -1: all)")
	f.otlpFlags.bind(fl)
}

func formatList() string {
	var names []string
	for _, f := range export.Formats() {
		names = append(names, string(f))
	}
	return strings.Join(names, ", ")
}

func runExport(cmd *cobra.Command, f *exportFlags, args []string) error {
	trace := args[0] // oneTrace checked there is one
	if f.format == "" {
		return hint.Wrap(errors.New("say which --format to write"), "one of "+formatList())
	}
	format, err := export.ParseFormat(f.format)
	if err != nil {
		return hint.Wrap(err, "see `cudatrace export --help`")
	}
	send := format == export.FormatOTLP && f.endpoint != ""
	if f.endpoint != "" && format != export.FormatOTLP {
		return hint.Wrap(fmt.Errorf("--otlp-endpoint is for --format otlp, not %s", format), "--format otlp --otlp-endpoint HOST:PORT")
	}
	if f.output == "" && !send {
		return hint.Wrap(errors.New("say where to write the output with -o FILE"), "-o - writes to standard output; --format otlp sends to --otlp-endpoint")
	}
	if err := f.check(); err != nil {
		return err
	}
	if f.entries < -1 {
		return hint.Wrap(fmt.Errorf("--memviz-entries %d: want a count, or -1 for all", f.entries), "e.g. --memviz-entries 100000")
	}
	at, err := export.ParseMoment(f.at)
	if err != nil {
		return hint.Wrap(err, "e.g. --at peak")
	}
	if err := checkTrace(trace); err != nil {
		return err
	}
	pids, err := f.selection(trace)
	if err != nil {
		return hint.Default(err, traceHint)
	}
	if f.output != "" {
		if err := outfile.Check(f.output); err != nil {
			return err
		}
	}
	entries := f.entries
	if entries == 0 {
		entries = export.MemvizNoTrace
	}
	opts := export.Options{NoSymbolize: f.noSymbolize, At: at, MemvizEntries: entries, PIDs: pids, Top: f.top,
		Warn: func(msg string) { cmd.PrintErrf("cudatrace: warning: %s\n", msg) }}
	if format == export.FormatOTLP {
		res, err := f.resource()
		if err != nil {
			return err
		}
		delete(res, "host.name") // the trace's host is not this one
		delete(res, "k8s.node.name")
		opts.OTLP = export.OTLPOptions{Resource: res, Version: version}
	}
	if send {
		if err := sendOTLP(cmd, &f.otlpFlags, trace, opts); err != nil {
			return hint.Default(err, traceHint)
		}
		if f.output == "" {
			return nil
		}
	}
	if err := writeExport(cmd.OutOrStdout(), trace, format, f.output, opts); err != nil {
		return hint.Default(err, traceHint)
	}
	if f.output != "-" {
		cmd.PrintErrf("cudatrace: %s written to %s\n", format, f.output)
	}
	return nil
}

// writeExport writes trace in format to out ("-": stdout). A file is
// written under a temporary name and renamed over out when complete, so a
// failed export never leaves half a profile where a tool would open it;
// out must be a regular file or a new one (internal/outfile).
func writeExport(stdout io.Writer, trace string, format export.Format, out string, opts export.Options) error {
	if out == outfile.Stdout {
		bw := bufio.NewWriter(stdout)
		if err := export.Write(bw, trace, format, opts); err != nil {
			return err
		}
		return bw.Flush()
	}
	f, err := outfile.Create(out)
	if err != nil {
		return err
	}
	defer f.Abort() // after Commit it does nothing
	bw := bufio.NewWriterSize(f, 1<<20)
	err = export.Write(bw, trace, format, opts)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = f.Commit()
	}
	if err != nil {
		return fmt.Errorf("export %s to %s: %w", trace, out, err)
	}
	return nil
}

// newExportCmd is `cudatrace export`: its help, its flags (exportFlags.bind) and runExport.
func newExportCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "export TRACE --format FORMAT -o OUT",
		Short: "Write a trace as a pprof profile, a PyTorch memory_viz snapshot, a Perfetto timeline, JSON or an HTML page",
		Long: `Export converts a trace written by 'cudatrace record -o' for the tools you
already use:

  pprof     a gzipped profile for 'go tool pprof', Pyroscope or Parca, in
            the Go heap profile's shape: inuse_space (the default view),
            inuse_objects, alloc_space, alloc_objects count GPU memory as
            the driver holds it (what the report calls GPU live). Tensors
            (PyTorch's blocks, inside that memory) and pinned host memory
            have sample types of their own: pick them with
            'go tool pprof -sample_index=tensor_inuse_space' (or
            host_inuse_space, tensor_alloc_space, ...). Labels pid, comm,
            device, api, kind, level and owner (who asked for it: pytorch,
            nccl, cublas, ... application; -tagfocus owner=nccl); job_id
            and rank for the ranks of a distributed job, node in a merged
            trace (-tagfocus rank=3; rank is also a number
            label, so rank=3:5 keeps ranks 3 to 5).
            inuse_* is the live set at --at.
  memviz    a pickle that https://pytorch.org/memory_viz and
            'python -m torch.cuda._memory_viz' open, like the snapshot of
            torch.cuda.memory._snapshot(): segments (the live set at --at)
            and a trace of the allocations and frees per device (the
            latest --memviz-entries of them; the Allocator Settings tab
            says when older ones were cut). VMM memory (cuMemCreate,
            PyTorch's expandable segments, XLA) is shown where cuMemMap
            mapped it, one expandable segment per run of adjacent
            mappings, with segment_map/segment_unmap entries; memory
            mapped nowhere at --at is left out (a note says how much).
            With PyTorch's tensor events, segments are cut into the live
            tensors' blocks as its caching allocator cuts them. OOM
            entries carry the free memory NVML saw last; without NVML in
            the trace they leave it out, and the Allocator Settings tab
            says so. One process: pick it with --pid, or --rank.
  perfetto  Chrome trace JSON for https://ui.perfetto.dev: live GPU memory
            per process and device as counter tracks (tensor memory too;
            a rank of a job titled "rank 3 · node-b · pid 4242", ranks in
            order),
            failed allocations as instant events on their named threads,
            with their stacks.
  json      the full report: processes, devices, stacks, failures, the peak.
  html      one self-contained page to open in any browser, offline (its
            script and style are in the file; nothing is fetched): memory
            over time per device, split by owner or by call path, with
            the driver's (NVML) figure beside it and the peak and failures
            marked; click a moment (the peak by default) for a flame graph
            of what was live then, by call path (Python lines and native
            frames, coloured by owner), with search and zoom; drag a range
            to see what it allocated and left live (leaks), the bytes each
            source line added and removed, each function's tensors used
            and memory acquired, and used and peaked per interval;
            failures with what was live; the report's processes, owners
            and notes. Its size follows what it draws, not the events: a
            10M-event trace makes a page of a few MB (its "About" tab says
            what was aggregated, and how finely). The whole trace: --at
            does not apply. 'cudatrace agent' serves the same page live
            at /ui.

Stacks are symbolized from the files on this machine, as 'cudatrace report'
does. The trace is read as a stream: memory stays bounded by the live set.`,
		Example: `  cudatrace export train.trace --format pprof -o train.pb.gz
  go tool pprof -http :8080 train.pb.gz

  # The live set at the peak rather than at the end
  cudatrace export train.trace --format pprof --at peak -o peak.pb.gz

  cudatrace export train.trace --format memviz -o train.pickle   # drop on pytorch.org/memory_viz
  cudatrace export train.trace --format perfetto -o train.json   # open in ui.perfetto.dev
  cudatrace export train.trace --format html -o train.html       # open in any browser, offline`,
		Args: oneTrace,
	}, (*exportFlags).bind, runExport)
}
