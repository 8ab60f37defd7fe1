package record

import (
	"bytes"
	"testing"

	"github.com/cudatrace/cudatrace/loader"
)

// TestUnwindMode: CUDATRACE_UNWIND's values, --keep-stack-windows and the
// test mode, and one line for a value that is none of them (before, it
// took the default silently).
func TestUnwindMode(t *testing.T) {
	for _, c := range []struct {
		env         string
		check, keep bool
		want        loader.UnwindMode
		warn        string
	}{
		{env: "", want: loader.UnwindBPF},
		{env: "bpf", want: loader.UnwindBPF},
		{env: "window", want: loader.UnwindOff},
		{env: "window", keep: true, want: loader.UnwindOff},
		{env: "", keep: true, want: loader.UnwindBoth},
		{env: "window", check: true, want: loader.UnwindBoth},
		{env: "Window", want: loader.UnwindBPF,
			warn: "cudatrace: warning: CUDATRACE_UNWIND=\"Window\" is not a way to unwind stacks (window, bpf): unwinding in BPF, the default\n"},
		{env: "off", keep: true, want: loader.UnwindBoth,
			warn: "cudatrace: warning: CUDATRACE_UNWIND=\"off\" is not a way to unwind stacks (window, bpf): unwinding in BPF, the default\n"},
	} {
		var stderr bytes.Buffer
		if got := unwindMode(c.env, c.check, c.keep, &stderr); got != c.want {
			t.Errorf("unwindMode(%q, check %v, keep %v) = %v, want %v", c.env, c.check, c.keep, got, c.want)
		}
		if stderr.String() != c.warn {
			t.Errorf("unwindMode(%q, check %v, keep %v) said %q, want %q", c.env, c.check, c.keep, stderr.String(), c.warn)
		}
	}
}
