package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/loader"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint32{"16MiB": 16 << 20, "16M": 16 << 20, "64mib": 64 << 20, "4096": 4096,
		"1G": 1 << 30, "256K": 256 << 10, " 8MB ": 8 << 20} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "abc", "3M", "100", "2G", "-1M", "1.5M"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
}

// --stack-window: 0 turns the window off (the loader's -1), sizes are whole
// pages up to 64 KiB.
func TestParseWindow(t *testing.T) {
	for in, want := range map[string]int{"0": -1, "4KiB": 4096, "16K": 16 << 10, "65536": 64 << 10, "12k": 12 << 10} {
		got, err := parseWindow(in)
		if err != nil || got != want {
			t.Errorf("parseWindow(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "5000", "128KiB", "1M", "-4K", "x"} {
		if got, err := parseWindow(in); err == nil {
			t.Errorf("parseWindow(%q) = %d, want an error", in, got)
		}
	}
}

// run executes the CLI in-process and returns its exit code and output.
func runCLI(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	root := newRoot(&out, &errb)
	root.SetArgs(args)
	err := root.Execute()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.code
	default:
		printError(&errb, err)
		code = 1
	}
	return code, out.String(), errb.String()
}

func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string // in stderr
	}{
		{[]string{"record"}, []string{"say what to trace", "hint: e.g. cudatrace record -- python train.py"}},
		{[]string{"record", "--pid", "1", "--all"}, []string{"one of them"}},
		{[]string{"record", "--ring-size", "3M", "--all"}, []string{"--ring-size \"3M\"", "power of two", "hint:"}},
		{[]string{"record", "--bogus"}, []string{"unknown flag: --bogus", "hint: see `cudatrace record --help`"}},
		{[]string{"report"}, []string{"say which trace to read"}},
		{[]string{"report", "/nonexistent/x.trace"}, []string{"/nonexistent/x.trace", "hint:"}},
		{[]string{"report", "x.trace", "--interval", "soon"}, []string{"--interval \"soon\": want a duration"}},
		{[]string{"export", "x.trace", "-o", "out"}, []string{"say which --format", "hint: one of pprof, memviz, perfetto, json"}},
		{[]string{"export", "x.trace", "--format", "svg", "-o", "out"}, []string{"unknown format \"svg\"", "hint:"}},
		{[]string{"export", "x.trace", "--format", "pprof"}, []string{"say where to write", "hint: -o - writes to standard output"}},
		{[]string{"export", "x.trace", "--format", "pprof", "--at", "later", "-o", "out"}, []string{"--at \"later\": want end, peak"}},
		{[]string{"export", "/nonexistent/x.trace", "--format", "json", "-o", "-"}, []string{"/nonexistent/x.trace", "hint:"}},
		{[]string{"record", "--export", "pprof", "--all"}, []string{"want FORMAT=FILE", "hint: e.g. --export pprof=train.pb.gz"}},
		{[]string{"agent", "--listen", "0.0.0.0:9738"}, []string{"not a loopback address", "hint: give --token-file FILE"}},
		{[]string{"agent", "--listen", "[::]:0"}, []string{"not a loopback address"}},
		{[]string{"agent", "--token-file", "/nonexistent/token"}, []string{"--token-file", "hint:"}},
		{[]string{"agent", "--retention", "0s"}, []string{"--retention 0s: must be positive"}},
		{[]string{"agent", "--ring-size", "3M"}, []string{"--ring-size \"3M\"", "power of two"}},
		{[]string{"agent", "extra"}, []string{"unknown command \"extra\""}},
		{[]string{"record", "--export", "svg=x", "--all"}, []string{"unknown format \"svg\""}},
		{[]string{"top", "--interval", "1ms"}, []string{"--interval 1ms is too short", "hint: e.g. --interval 1s"}},
		{[]string{"top", "--pid", "4194303"}, []string{"pid 4194303: no such process", "hint: check the PID"}},
		{[]string{"top", "now"}, []string{"unknown command \"now\" for \"cudatrace top\""}},
	} {
		code, _, stderr := runCLI(c.args...)
		if code != 1 {
			t.Errorf("%q: exit %d, want 1", c.args, code)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%q: stderr %q lacks %q", c.args, stderr, w)
			}
		}
		if strings.Contains(stderr, "goroutine ") || strings.Contains(stderr, "Usage:") {
			t.Errorf("%q: stderr has a stack trace or the usage dump:\n%s", c.args, stderr)
		}
	}
}

func TestHelpTeaches(t *testing.T) {
	for _, verb := range []string{"record", "report", "export", "top"} {
		code, stdout, _ := runCLI(verb, "--help")
		if code != 0 || !strings.Contains(stdout, "Examples:") || !strings.Contains(stdout, "cudatrace "+verb) {
			t.Errorf("%s --help: exit %d, no examples:\n%s", verb, code, stdout)
		}
	}
	_, stdout, _ := runCLI("--help")
	if strings.Contains(stdout, launchCmdName) {
		t.Errorf("the hidden %s verb shows in --help", launchCmdName)
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{"127.0.0.1:9738": true, "localhost:1": true, "[::1]:0": true,
		"127.0.0.2:80": true, "0.0.0.0:9738": false, ":9738": false, "10.0.0.1:9738": false, "[::]:0": false, "bad": false} {
		if got := loopback(addr); got != want {
			t.Errorf("loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

// record's default ring is 64 MiB, and holds as many allocation records
// with windows whatever the --stack-window: 64 KiB windows in a 16 MiB
// ring lost events on an idle VM (loader.DefaultRingBytes). A --ring-size
// given wins; top and the agent have no window flag and keep 64 MiB.
func TestRingDefaultFollowsWindow(t *testing.T) {
	for _, c := range []struct {
		args []string
		want uint32
	}{
		{nil, 64 << 20},
		{[]string{"--stack-window", "0"}, 64 << 20},
		{[]string{"--stack-window", "4KiB"}, 64 << 20},
		{[]string{"--stack-window", "32KiB"}, 64 << 20},
		{[]string{"--stack-window", "48KiB"}, 64 << 20},
		{[]string{"--stack-window", "64KiB"}, 64 << 20},
		{[]string{"--stack-window", "64KiB", "--ring-size", "16MiB"}, 16 << 20},
		{[]string{"--ring-size", "1MiB"}, 1 << 20},
	} {
		var f recordFlags
		fl := pflag.NewFlagSet("record", pflag.ContinueOnError)
		f.bind(fl)
		if err := fl.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		window, err := parseWindow(f.window)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		got, err := f.ring(window)
		if err != nil || got != c.want {
			t.Errorf("record %v: ring %d (%v), want %d", c.args, got, err, c.want)
		}
	}
	var top topFlags
	fl := pflag.NewFlagSet("top", pflag.ContinueOnError)
	top.bind(fl)
	if got, err := top.ring(loader.DefaultStackWindow); err != nil || got != 64<<20 {
		t.Errorf("top: ring %d (%v), want 64 MiB", got, err)
	}
	if u := fl.Lookup("ring-size").Usage; strings.Contains(u, "stack-window") {
		t.Errorf("top's --ring-size names a --stack-window it does not have: %q", u)
	}
}
