package main

// flags.go: the flags verbs share and the checks made on them before
// anything is read or attached. The verbs that trace (record, top, agent)
// share --pid as one type (pidList) and --ring-size; those that read a
// trace (report, export) share readFlags. Every message is one line in
// cudatrace's words, never pflag's or strconv's.

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/pystack"
)

// verb is the shape every verb's command shares: its texts in c, its
// flags bound into a struct of their own by bind, and RunE handing that
// struct and the arguments to run.
func verb[F any](c *cobra.Command, bind func(*F, *pflag.FlagSet), run func(*cobra.Command, *F, []string) error) *cobra.Command {
	f := new(F)
	bind(f, c.Flags())
	c.RunE = func(cmd *cobra.Command, args []string) error { return run(cmd, f, args) }
	return c
}

// pidList is --pid: process IDs, repeatable or comma-separated.
type pidList []uint32

func (p *pidList) String() string {
	s := make([]string, len(*p))
	for i, v := range *p {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return "[" + strings.Join(s, ",") + "]"
}

func (p *pidList) Type() string { return "pid" }

func (p *pidList) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil || v == 0 || v > 1<<22 { // the kernel's PID_MAX_LIMIT
			return fmt.Errorf("not a process ID (want a whole number from 1 to %d)", 1<<22)
		}
		*p = append(*p, uint32(v))
	}
	return nil
}

// ints is the list as record.Options takes it.
func (p pidList) ints() []int {
	out := make([]int, len(p))
	for i, v := range p {
		out[i] = int(v)
	}
	return out
}

func addPIDFlag(fl *pflag.FlagSet, p *pidList, usage string) {
	fl.VarP(p, "pid", "p", usage)
}

// traceFlags are the flags of the verbs that trace (record, top, agent),
// each meaning the same in all three; nvml and noSymbolize say what they do
// in the verb's own words.
type traceFlags struct {
	libs        []string
	ringSize    string
	noSymbolize bool
	noPy        bool
	nvml        bool
}

func (f *traceFlags) add(fl *pflag.FlagSet, symbolizeUsage, nvmlUsage string) {
	fl.StringArrayVar(&f.libs, "lib", nil, "CUDA library file to probe (repeatable); default: found automatically")
	fl.StringVar(&f.ringSize, "ring-size", "", "BPF ring buffer size, a power of two holding at least 8 allocation records of the stack window (256KiB for 16KiB); once the reader is behind by half of it, records go without their windows (counted, said), and when it is full events are lost: raise it if either happens (default 64MiB: ~250,000 records of up to 23 frames, ~1,000 with 64KiB windows)")
	fl.BoolVar(&f.noSymbolize, "no-symbolize", false, symbolizeUsage)
	fl.BoolVar(&f.noPy, "no-python-frames", false, "leave CPython "+pystack.Versions()+" processes' Python frames (file:line:function, in place of the interpreter loop) out of their stacks")
	fl.BoolVar(&f.nvml, "nvml", true, nvmlUsage)
}

// ring checks --ring-size against the stack window each record holds.
func (f *traceFlags) ring(window int) (uint32, error) {
	if f.ringSize == "" {
		return loader.DefaultRingBytes, nil
	}
	ring, err := parseSize(f.ringSize)
	if err != nil {
		return 0, hint.Wrap(fmt.Errorf("--ring-size %q: %w", f.ringSize, err), "e.g. --ring-size 64MiB")
	}
	return ring, checkRing(ring, f.ringSize, window)
}

// readFlags are the flags of the verbs that read a trace.
type readFlags struct {
	pids        tracePIDs
	ranks       []int
	job         string
	noSymbolize bool
	top         int
}

func (f *readFlags) add(fl *pflag.FlagSet, topUsage string) {
	fl.VarP(&f.pids, "pid", "p", "only this process (repeatable)")
	fl.IntSliceVar(&f.ranks, "rank", nil, "only the process of this rank in its distributed job (repeatable)")
	fl.StringVar(&f.job, "job", "", "with --rank, the job of the ranks, where the trace has several (its id, as report shows it)")
	fl.BoolVar(&f.noSymbolize, "no-symbolize", false, "leave stacks as addresses")
	fl.IntVar(&f.top, "top", 20, topUsage)
}

func (f *readFlags) check() error {
	if f.top < 0 {
		return hint.Wrap(fmt.Errorf("--top %d: must be 0 or more", f.top), "e.g. --top 5")
	}
	return nil
}

// nonNegative checks a duration flag.
func nonNegative(name string, v fmt.Stringer, negative bool) error {
	if negative {
		return hint.Wrap(fmt.Errorf("--%s %s: must not be negative", name, v), "e.g. --"+name+" 30s")
	}
	return nil
}

// traceHint is the hint for a path that is not a readable trace.
const traceHint = "give the path of a file written by `cudatrace record -o FILE`"

// oneTrace is the Args of report and export: exactly one trace.
func oneTrace(cmd *cobra.Command, args []string) error {
	switch len(args) {
	case 1:
		return nil
	case 0:
		return hint.Wrap(errors.New("say which trace to read"), "e.g. "+cmd.CommandPath()+" train.trace")
	}
	return hint.Wrap(fmt.Errorf("one trace at a time: got %d (%s)", len(args), strings.Join(args, " ")),
		"run "+cmd.CommandPath()+" once per trace")
}

// checkTrace says, before reading, what makes path no trace at all.
func checkTrace(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return hint.Wrap(fmt.Errorf("no trace at %s: no such file", path), traceHint)
	case err != nil:
		return hint.Wrap(fmt.Errorf("cannot read the trace %s: %w", path, errors.Unwrap(err)), "check the file's permissions")
	case fi.IsDir():
		return hint.Wrap(fmt.Errorf("%s is a directory, not a trace", path), traceHint)
	}
	return nil
}

// pflagInvalid is pflag's message for a value its parser refused.
var pflagInvalid = regexp.MustCompile(`^invalid argument "(.*)" for "(?:-\w, )?--([\w-]+)" flag: (.*)$`)

// flagError turns pflag's messages into one line in cudatrace's words:
// `--top "x": want a whole number`, not `strconv.ParseInt: parsing "x":
// invalid syntax`.
func flagError(c *cobra.Command, err error) error {
	help := fmt.Sprintf("see `%s --help`", c.CommandPath())
	m := pflagInvalid.FindStringSubmatch(err.Error())
	if m == nil {
		return hint.Wrap(err, help)
	}
	value, name, why := m[1], m[2], m[3]
	want := why
	if fl := c.Flags().Lookup(name); fl != nil {
		switch fl.Value.Type() {
		case "duration":
			want = "want a duration such as 30s or 5m"
		case "int", "int32", "int64", "intSlice":
			want = "want a whole number"
		case "uint", "uint32", "uint64", "uintSlice":
			want = "want a whole number, 0 or more"
		case "bool":
			want = "want true or false"
		case "float64":
			want = "want a number"
		}
	}
	return hint.Wrap(fmt.Errorf("--%s %q: %s", name, value, want), help)
}

// checkTargets checks, before anything is attached, that the command to
// launch can be run and that every --pid is a running process.
func checkTargets(command []string, pids pidList) error {
	if len(command) > 0 {
		if _, err := exec.LookPath(command[0]); err != nil {
			if errors.Is(err, os.ErrNotExist) || errors.Is(err, exec.ErrNotFound) {
				return hint.Wrap(fmt.Errorf("command %q not found", command[0]), "check its name, or give its path")
			}
			return hint.Wrap(fmt.Errorf("cannot run %q: %w", command[0], errors.Unwrap(err)), "check that it is an executable file")
		}
	}
	for _, pid := range pids {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return hint.Wrap(fmt.Errorf("pid %d: no such process", pid), "check the PID with ps or nvidia-smi")
		}
	}
	return nil
}
