package main

// budget.go: record's GPU memory budgets (--max-peak, --max-live-at-exit),
// for CI: record exits exitOverBudget when a traced process went over one,
// printing a line per budget and process that names the stacks holding the
// memory.

import (
	"cmp"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/report"
)

// exitOverBudget is record's exit status when the command succeeded (or
// none was launched) and the trace was written whole, but a traced
// process went over --max-peak or --max-live-at-exit. A command that
// failed keeps its own status, and a trace not written whole 125 (the
// budget lines are printed all the same).
const exitOverBudget = 122

// budgetStacks is how many stacks a budget line names.
const budgetStacks = 3

type budgetFlags struct {
	maxPeak, maxLive string
	peak, live       uint64 // parsed; 0: no budget
}

func (f *budgetFlags) bind(fl *pflag.FlagSet) {
	fl.StringVar(&f.maxPeak, "max-peak", "", fmt.Sprintf("exit %d when a traced process's GPU memory peaked above SIZE (e.g. 8GiB), naming the stacks that held it then", exitOverBudget))
	fl.StringVar(&f.maxLive, "max-live-at-exit", "", fmt.Sprintf("exit %d when a traced process still held more than SIZE of GPU memory at the end, naming the stacks that held it", exitOverBudget))
}

// parse reads the sizes, before anything is traced.
func (f *budgetFlags) parse() error {
	for _, b := range []struct {
		flag, s string
		v       *uint64
	}{{"max-peak", f.maxPeak, &f.peak}, {"max-live-at-exit", f.maxLive, &f.live}} {
		if b.s == "" {
			continue
		}
		v, err := parseBytes(b.s)
		if err == nil && v == 0 {
			err = fmt.Errorf("must be more than 0")
		}
		if err != nil {
			return hint.Wrap(fmt.Errorf("--%s %q: %w", b.flag, b.s, err), "a size, e.g. --"+b.flag+" 8GiB")
		}
		*b.v = v
	}
	return nil
}

func (f *budgetFlags) any() bool { return f.peak > 0 || f.live > 0 }

// check compares each process of l with the budgets and writes one line
// per process and budget exceeded; trace names the stacks. It reports
// whether any was.
//
// Live at exit is what the process held when it ended (the ledger's
// held-at-exit figure, from its exit record), or its live set when
// recording stopped first.
func (f *budgetFlags) check(w io.Writer, l *ledger.Ledger, trace string) bool {
	type over struct {
		p          *ledger.Process
		peak, live bool
	}
	var overs []over
	var pids []uint32
	for _, p := range l.Processes() {
		o := over{p: p, peak: f.peak > 0 && p.Peak > f.peak, live: f.live > 0 && atExit(p) > f.live}
		if o.peak || o.live {
			overs = append(overs, o)
			pids = append(pids, p.PID)
		}
	}
	if len(overs) == 0 {
		return false
	}
	rep, err := report.Load(trace, report.Options{PIDs: pids, Top: budgetStacks})
	if err != nil {
		rep = nil // the figures stand; only the stacks are missing
		fmt.Fprintf(w, "cudatrace: the stacks over budget could not be named: %v\n", err)
	}
	for _, o := range overs {
		p := o.p
		if o.peak {
			var held []string
			if rep != nil {
				for _, s := range rep.PeakStacks {
					if s.PID == p.PID {
						held = append(held, units.Bytes(s.LiveBytes)+" "+stackName(s.Frames))
					}
				}
			}
			fmt.Fprintf(w, "cudatrace: over budget: pid %d (%s) peaked at %s of GPU memory, %s over --max-peak %s; held at the peak by: %s\n",
				p.PID, p.Comm, units.Bytes(p.Peak), units.Bytes(p.Peak-f.peak), f.maxPeak, orNone(held))
		}
		if o.live {
			var held []string
			if rep != nil {
				for _, s := range rep.Stacks {
					if s.PID == p.PID && s.LiveBytes > 0 && len(held) < budgetStacks {
						held = append(held, units.Bytes(s.LiveBytes)+" "+stackName(s.Frames))
					}
				}
			}
			fmt.Fprintf(w, "cudatrace: over budget: pid %d (%s) held %s of GPU memory at exit, %s over --max-live-at-exit %s; held by: %s\n",
				p.PID, p.Comm, units.Bytes(atExit(p)), units.Bytes(atExit(p)-f.live), f.maxLive, orNone(held))
		}
	}
	return true
}

// atExit is p's GPU memory at its end: what it held at exit once it
// ended, else what it holds now.
func atExit(p *ledger.Process) uint64 {
	if p.Exited {
		return p.HeldAtExitBytes
	}
	return p.Live
}

func orNone(held []string) string {
	if len(held) == 0 {
		return "(no stacks)"
	}
	return strings.Join(held, "; ")
}

// stackName names a stack in a few words: its first frames outside CUDA's
// own libraries, innermost first, "function (file:line)" or the module and
// offset of an unnamed one.
func stackName(frames []report.Frame) string {
	var parts []string
	for _, f := range frames {
		if f.Module != pystack.Module && owner.IsCUDA(f.Module) {
			continue
		}
		s := cmp.Or(f.Short(), f.Address)
		parts = append(parts, s)
		if len(parts) == budgetStacks {
			break
		}
	}
	if len(parts) == 0 {
		return "[no frames]"
	}
	return strings.Join(parts, " < ")
}
