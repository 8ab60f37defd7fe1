package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/report"
)

type diffFlags struct {
	json        bool
	top         int
	noSymbolize bool
}

func (f *diffFlags) bind(fl *pflag.FlagSet) {
	fl.BoolVar(&f.json, "json", false, "print the diff as JSON (every changed stack)")
	fl.IntVar(&f.top, "top", 10, "how many changed stacks the text shows")
	fl.BoolVar(&f.noSymbolize, "no-symbolize", false, "leave stacks as addresses (they then match only where both runs mapped their files alike)")
}

func runDiff(cmd *cobra.Command, f *diffFlags, args []string) error {
	if len(args) != 2 {
		return hint.Wrap(fmt.Errorf("want two traces, got %d", len(args)), "e.g. cudatrace diff main.trace branch.trace")
	}
	if f.top < 0 {
		return hint.Wrap(fmt.Errorf("--top %d: must be 0 or more", f.top), "e.g. --top 5")
	}
	for _, a := range args {
		if err := checkTrace(a); err != nil {
			return err
		}
	}
	d, err := report.LoadDiff(args[0], args[1], report.Options{NoSymbolize: f.noSymbolize})
	if err != nil {
		return hint.Default(err, traceHint)
	}
	if f.json {
		return d.WriteJSON(cmd.OutOrStdout())
	}
	return d.WriteText(cmd.OutOrStdout(), f.top)
}

// newDiffCmd is `cudatrace diff`: its help, its flags (diffFlags.bind) and runDiff.
func newDiffCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "diff A.trace B.trace",
		Short: "Compare two traces' GPU memory: peak, live at end, per owner and per stack",
		Long: `Diff reads two traces (a run before and after a change, say) and prints what
changed from A to B: the GPU memory at the peak and live at the end, summed
over each trace's processes; per owner (PyTorch's allocator, NCCL, cuBLAS,
... the application: see 'cudatrace report'), at the peak and at the end; and
each call path whose memory at the peak, at the end or allocated in all
changed, the most changed first.

Stacks are matched by their symbolized frames, not their addresses, which
differ between runs: a Python frame by file, line and function, a native one
by its file's name and function (or offset in the file where unnamed). A
path only one trace has is set against 0 in the other.

With 'record --max-peak' and '--max-live-at-exit' (a budget that fails a CI
job), diff says what moved when the budget is broken.`,
		Example: `  # What did the branch change?
  cudatrace record -o main.trace -- python train.py --steps 20
  git checkout my-branch
  cudatrace record -o branch.trace -- python train.py --steps 20
  cudatrace diff main.trace branch.trace

  # For a script: the peak's change in bytes
  cudatrace diff main.trace branch.trace --json | jq .peak_bytes.delta`,
	}, (*diffFlags).bind, runDiff)
}
