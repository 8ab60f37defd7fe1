package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// inputTrace writes a small trace of pid 7 (1 s long) and a copy damaged
// in its last event.
func inputTrace(t *testing.T) (good, damaged string) {
	const base = 5_000_000_000
	ev := func(tm uint64, addr uint64) events.Event {
		return events.Event{Time: base + tm, Duration: 10, PID: 7, TID: 7, Comm: "train", API: events.CudaMalloc,
			Addr: addr, Size: 4096, Stack: []uint64{0xa1}}
	}
	good, ends := tracetest.Write(t, tracefile.Meta{Tool: "t", StartWall: time.Unix(1700000000, 0), StartBoot: base},
		&tracefile.Process{PID: 7, Comm: "train", Time: base},
		ev(1000, 0x1000), ev(2000, 0x2000), ev(3000, 0x3000),
		&tracefile.End{Time: base + uint64(time.Second)})
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	data[ends[3]-6] ^= 0xff // the last event's payload
	damaged = filepath.Join(t.TempDir(), "damaged.trace")
	if err := os.WriteFile(damaged, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return good, damaged
}

// Every bad input gets one error line in cudatrace's words (no cobra,
// pflag or strconv message), a hint that fits it, and exit status 1, and
// nothing is written. The record cases fail before any probe is
// attached: the error is the check's own, not the loader's.
func TestBadInput(t *testing.T) {
	good, _ := inputTrace(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	for _, c := range []struct {
		args       []string
		line, hint string
	}{
		{[]string{"report"}, "say which trace to read", "e.g. cudatrace report train.trace"},
		{[]string{"export", "-f", "pprof", "-o", out}, "say which trace to read", "e.g. cudatrace export train.trace"},
		{[]string{"report", good, good}, "one trace at a time: got 2 (" + good + " " + good + ")", "run cudatrace report once per trace"},
		{[]string{"report", dir}, dir + " is a directory, not a trace", "give the path of a file written by `cudatrace record -o FILE`"},
		{[]string{"report", filepath.Join(dir, "none.trace")}, "no trace at " + filepath.Join(dir, "none.trace") + ": no such file", "give the path of a file"},
		{[]string{"report", good, "--top", "-3"}, "--top -3: must be 0 or more", "e.g. --top 5"},
		{[]string{"report", good, "--top", "x"}, `--top "x": want a whole number`, "see `cudatrace report --help`"},
		{[]string{"report", good, "--min-age", "-5s"}, "--min-age -5s: must not be negative", "e.g. --min-age 30s"},
		{[]string{"report", good, "--interval", "-5s"}, "--interval -5s: must not be negative", "e.g. --interval 30s"},
		{[]string{"report", good, "--interval", "soon"}, `--interval "soon": want a duration such as 30s or 5m`, "see `cudatrace report --help`"},
		{[]string{"report", good, "--pid", "999"}, "pid 999 is not in the trace", "the trace has pid 7"},
		{[]string{"report", good, "--pid", "-1"}, `--pid "-1": not a process ID (want a whole number from 1 to 4294967295, or NODE:PID in a merged trace)`, "see `cudatrace report --help`"},
		{[]string{"report", good, "--rank", "0"}, "--rank: no process of the trace has a rank", "choose processes with --pid"},
		{[]string{"report", good, "--job", "slurm:1"}, "--job chooses the job of --rank", "add --rank N"},
		{[]string{"export", good, "-f", "memviz", "--rank", "x", "-o", out}, `--rank "x": want a whole number`, "see `cudatrace export --help`"},
		{[]string{"merge", "-o", out}, "say which traces to merge", "e.g. cudatrace merge node-a.trace"},
		{[]string{"merge", good}, "say where to write the merged trace with -o FILE", "e.g. -o job.trace"},
		{[]string{"merge", good, filepath.Join(dir, "none.trace"), "-o", out}, "no trace at " + filepath.Join(dir, "none.trace") + ": no such file", "give the path of a file"},
		{[]string{"merge", good, "-o", "/nonexistent/dir/job.trace"}, "cannot write output /nonexistent/dir/job.trace: no such file or directory", "check that its directory exists"},
		{[]string{"export", good, "-f", "memviz", "--pid", "999", "-o", out}, "export " + good + " to " + out + ": pid 999 is not in the trace", "the trace has pid 7"},
		{[]string{"export", good, "-f", "pprof", "--at", "1h", "-o", out}, "export " + good + " to " + out + ": --at 1h0m0s is past the end of the trace, which lasts 1s", "give a time within it, or --at end"},
		{[]string{"export", good, "-f", "pprof", "--top", "-1", "-o", out}, "--top -1: must be 0 or more", "e.g. --top 5"},
		{[]string{"export", good, "-f", "pprof", "-o", "/nonexistent/dir/out.pb.gz"}, "cannot write output /nonexistent/dir/out.pb.gz: no such file or directory", "check that its directory exists and can be written"},
		{[]string{"export", dir, "-f", "pprof", "-o", out}, dir + " is a directory, not a trace", "give the path of a file"},
		{[]string{"export", good, "-f", "memviz", "--memviz-entries", "-2", "-o", out}, "--memviz-entries -2: want a count, or -1 for all", "e.g. --memviz-entries 100000"},
		{[]string{"record", "-o", out, "--", "/no/such/cmd"}, `command "/no/such/cmd" not found`, "check its name, or give its path"},
		{[]string{"record", "-o", "/nonexistent/dir/x.trace", "--", "true"}, "cannot write output /nonexistent/dir/x.trace: no such file or directory", "check that its directory exists"},
		{[]string{"record", "--pid", "4194303", "-o", out}, "pid 4194303: no such process", "check the PID with ps or nvidia-smi"},
		{[]string{"record", "--pid", "x", "-o", out}, `--pid "x": not a process ID (want a whole number from 1 to 4194304)`, "see `cudatrace record --help`"},
		{[]string{"record", "--no-symbolize", "--portable", "-o", out, "--", "true"}, "--portable names every frame while recording, --no-symbolize none", "pick one"},
		{[]string{"agent", "--ring-size", "3M"}, `--ring-size "3M": must be a power of two between 4096 bytes and 1GiB`, "e.g. --ring-size 64MiB"},
		{[]string{"top", "--top", "-1"}, "--top -1: must be 0 or more", "e.g. --top 5"},
		{[]string{"top", "--ring-size", "3M"}, `--ring-size "3M": must be a power of two between 4096 bytes and 1GiB`, "e.g. --ring-size 64MiB"},
		{[]string{"top", "--pid", "0"}, `--pid "0": not a process ID (want a whole number from 1 to 4194304)`, "see `cudatrace top --help`"},
	} {
		code, stdout, stderr := runCLI(c.args...)
		lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
		if code != 1 || len(lines) != 2 || lines[0] != "cudatrace: "+c.line || !strings.HasPrefix(lines[1], "  hint: "+c.hint) {
			t.Errorf("%q: exit %d, stderr\n%s\nwant exit 1 and\ncudatrace: %s\n  hint: %s...", c.args, code, stderr, c.line, c.hint)
		}
		for _, leak := range []string{"strconv", "accepts 1 arg", "invalid argument", "empty file"} {
			if strings.Contains(stderr, leak) {
				t.Errorf("%q: stderr has %q: %s", c.args, leak, stderr)
			}
		}
		if stdout != "" {
			t.Errorf("%q: wrote %q to stdout", c.args, stdout)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%q: wrote %s", c.args, out)
		}
	}
}

// export of a damaged trace says so, as report does, and writes what
// came before the damage.
func TestExportWarnsDamage(t *testing.T) {
	_, damaged := inputTrace(t)
	for _, format := range []string{"pprof", "memviz", "perfetto", "json"} {
		out := filepath.Join(t.TempDir(), "out")
		code, _, stderr := runCLI("export", damaged, "-f", format, "-o", out)
		if code != 0 || !strings.Contains(stderr, "cudatrace: warning: trace damaged:") {
			t.Errorf("export -f %s of a damaged trace: exit %d, stderr %q; want exit 0 and the damage warning", format, code, stderr)
		}
	}
	code, stdout, _ := runCLI("report", damaged)
	if code != 0 || !strings.Contains(stdout, "Warning: trace damaged:") {
		t.Errorf("report of a damaged trace: exit %d, no warning:\n%s", code, stdout)
	}
}

// The verbs that trace share their flags: each has every one of them.
func TestTraceFlagsShared(t *testing.T) {
	root := newRoot(nil, nil)
	for _, verb := range []string{"record", "top", "agent"} {
		cmd, _, err := root.Find([]string{verb})
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"lib", "ring-size", "no-symbolize", "no-python-frames", "nvml"} {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("%s has no --%s", verb, name)
			}
		}
	}
}
