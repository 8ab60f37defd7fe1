package main

import (
	"github.com/spf13/cobra"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/report"
)

type reportFlags struct {
	json bool
	top  int
}

func newReportCmd() *cobra.Command {
	var f reportFlags
	cmd := &cobra.Command{
		Use:   "report TRACE",
		Short: "Summarize a trace: memory per process and device, top allocation stacks, failures",
		Long: `Report reads a trace written by 'cudatrace record -o' and prints, per process,
allocation and free counts, bytes allocated, GPU memory live at the end and
at its peak (per device), pinned host memory, the call stacks that allocated
the most memory still live, and every failed allocation with its CUDA error.

Stacks are symbolized from the libraries and executables on this machine,
checked against the build IDs captured while recording. A trace cut short
(the tracer was killed) is reported up to its last complete record.`,
		Example: `  cudatrace report train.trace
  cudatrace report train.trace --top 5
  cudatrace report train.trace --json | jq '.processes[] | {pid, live_bytes, peak_bytes}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rep, err := report.Load(args[0], report.Options{Top: f.top})
			if err != nil {
				return hint.Wrap(err, "give the path of a file written by `cudatrace record -o FILE`")
			}
			if rep.Warning != "" && f.json { // the text report carries it itself
				cmd.PrintErrf("cudatrace: warning: %s\n", rep.Warning)
			}
			if f.json {
				return rep.WriteJSON(cmd.OutOrStdout())
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&f.json, "json", false, "print the report as JSON")
	cmd.Flags().IntVar(&f.top, "top", 20, "how many stacks to show in the text report")
	return cmd
}
