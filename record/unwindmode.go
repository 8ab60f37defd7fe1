package record

import (
	"fmt"
	"io"

	"github.com/cudatrace/cudatrace/loader"
)

// unwindMode is where a recording's allocation stacks are unwound, from
// CUDATRACE_UNWIND (env), the test mode that checks BPF's stacks against
// the window's (check) and --keep-stack-windows (keep).
//
// Stacks are unwound in BPF (bpf/unwind.h), from each file's call-frame
// rules, a stack unwound once answered from its memo while the words it
// read stay the same; a record whose unwind falls back (no rules yet for a
// file, a signal frame) copies the window as before, for the user-space
// unwinder. On the VMs it was measured on, a pair's BPF time at 25
// frames is 0.48x of the window copy's in 0c85d75 (the build issue 41
// measured), and a burst of 10M events on a loaded machine loses none
// (docs/benchmarks.md, 2026-11-30, fifth).
// CUDATRACE_UNWIND=window copies the window into every record instead;
// "bpf" names the default; any other value is said, in one line, and the
// default taken.
func unwindMode(env string, check, keep bool, stderr io.Writer) loader.UnwindMode {
	switch {
	case check:
		return loader.UnwindBoth // the window too, the reference
	case env == "window":
		return loader.UnwindOff
	case env != "" && env != "bpf":
		fmt.Fprintf(stderr, "cudatrace: warning: CUDATRACE_UNWIND=%q is not a way to unwind stacks (window, bpf): unwinding in BPF, the default\n", env)
	}
	if keep {
		return loader.UnwindBoth
	}
	return loader.UnwindBPF
}
