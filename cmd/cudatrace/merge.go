package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/internal/outfile"
	"github.com/cudatrace/cudatrace/merge"
	"github.com/cudatrace/cudatrace/tracefile"
)

type mergeFlags struct {
	output    string
	tokenFile string
}

func (f *mergeFlags) bind(fl *pflag.FlagSet) {
	fl.StringVarP(&f.output, "output", "o", "", "write the merged trace to this file, created 0600 or replaced keeping its mode; never a device, FIFO, socket or directory")
	fl.StringVar(&f.tokenFile, "token-file", "", "for http(s) inputs: the agents' bearer token (the file's content, as the agent's own --token-file)")
}

// maxFetches bounds the agents' windows fetched at once.
const maxFetches = 16

func runMerge(cmd *cobra.Command, f *mergeFlags, args []string) error {
	if len(args) == 0 {
		return hint.Wrap(errors.New("say which traces to merge"), "e.g. cudatrace merge node-a.trace node-b.trace -o job.trace")
	}
	if f.output == "" || f.output == outfile.Stdout {
		return hint.Wrap(errors.New("say where to write the merged trace with -o FILE"), "e.g. -o job.trace")
	}
	token, err := readToken(f.tokenFile)
	if err != nil {
		return err
	}
	var urls int
	for _, a := range args {
		if isURL(a) {
			urls++
			continue
		}
		if err := checkTrace(a); err != nil {
			return err
		}
	}
	if err := outfile.Check(f.output); err != nil {
		return err
	}
	ins := make([]merge.Input, len(args))
	if urls > 0 {
		// Beside the output: the windows may be large, and the output's
		// file system has room for them merged.
		dir, err := os.MkdirTemp(filepath.Dir(f.output), ".cudatrace-merge-")
		if err != nil {
			return fmt.Errorf("a directory for the fetched traces: %w", err)
		}
		defer os.RemoveAll(dir)
		ins, err = fetchAll(cmd.Context(), args, dir, token, func(msg string) { cmd.PrintErrf("cudatrace: warning: %s\n", msg) })
		if err != nil {
			return err
		}
	} else {
		for i, a := range args {
			ins[i] = merge.Input{Path: a}
		}
	}

	out, err := outfile.Create(f.output)
	if err != nil {
		return err
	}
	defer out.Abort() // after Commit it does nothing
	bw := bufio.NewWriterSize(out, 1<<20)
	res, err := merge.Write(bw, ins, "cudatrace "+version+" merge")
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		err = out.Commit()
	}
	if err != nil {
		return hint.Default(fmt.Errorf("merge into %s: %w", f.output, err), traceHint)
	}
	for _, w := range res.Warnings {
		cmd.PrintErrf("cudatrace: warning: %s\n", w)
	}
	var hosts []string
	for _, n := range res.Nodes {
		hosts = append(hosts, n.Host)
	}
	renumbered := ""
	count := func(n int, what string) string {
		if n == 1 {
			return "1 " + what
		}
		return fmt.Sprintf("%d %ss", n, what)
	}
	if res.Renumbered > 0 {
		renumbered = fmt.Sprintf("; %s numbered anew (their PID was another node's: node_pid keeps theirs)",
			strings.Replace(count(res.Renumbered, "process"), "processs", "processes", 1))
	}
	cmd.PrintErrf("cudatrace: merged %s (%s), %s, into %s%s\n", count(len(res.Nodes), "trace"), strings.Join(hosts, ", "),
		count(int(res.Events), "event"), f.output, renumbered)
	cmd.PrintErrf("cudatrace: clocks: %s\n", clocks(res.Nodes))
	return nil
}

// clocks says, per node, how its wall clock was kept when its trace
// began: what the merged timeline's alignment rests on.
func clocks(nodes []tracefile.Node) string {
	var parts []string
	for _, n := range nodes {
		s := n.Host + " "
		switch {
		case n.Clock == nil:
			s += "not recorded"
		case !n.Clock.Synced:
			s += "NOT synchronized"
		default:
			s += fmt.Sprintf("synchronized (estimated error %s)", time.Duration(n.Clock.EstError))
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func isURL(s string) bool { return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://") }

// fetchAll fetches the URLs among args (agents' /trace windows) into dir,
// several at once, and returns every input in the order given. A window
// that cannot be fetched is left out with a warning: the others are not
// lost for it. None fetched, and no file given, is an error.
func fetchAll(ctx context.Context, args []string, dir, token string, warn func(string)) ([]merge.Input, error) {
	ins := make([]merge.Input, len(args))
	errs := make([]error, len(args))
	sem := make(chan struct{}, maxFetches)
	var wg sync.WaitGroup
	for i, a := range args {
		if !isURL(a) {
			ins[i] = merge.Input{Path: a}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			path := filepath.Join(dir, fmt.Sprintf("%d.trace", i))
			errs[i] = fetch(ctx, a, token, path)
			ins[i] = merge.Input{Path: path, Name: a}
		}()
	}
	wg.Wait()
	var out []merge.Input
	for i, in := range ins {
		if errs[i] != nil {
			warn(fmt.Sprintf("%s: %v; left out of the merge", args[i], errs[i]))
			continue
		}
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, hint.Wrap(errors.New("no trace could be fetched"), "check the agents' URLs, and --token-file where they have a token")
	}
	return out, nil
}

// fetch GETs url (an agent's /trace window, which takes as long as the
// window it asks for) into path.
func fetch(ctx context.Context, url, token, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		line, _, _ := strings.Cut(strings.TrimSpace(string(body)), "\n")
		return fmt.Errorf("%s: %s", resp.Status, line)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("reading the window: %w", err)
	}
	return f.Close()
}

// newMergeCmd is `cudatrace merge`: its help, its flags (mergeFlags.bind) and runMerge.
func newMergeCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "merge TRACE|URL... -o OUT",
		Short: "Put the traces of a job's nodes on one timeline, in one trace",
		Long: `Merge reads the traces of a job's nodes (one 'cudatrace record -o' per node, or
the agents' /trace windows, fetched from their URLs) and writes one trace of
them all, which report, export and diff read as any other.

Its clock is the wall clock: each node's times are put where its wall clock
said they were (every trace records its wall clock and boot clock together
when it begins). Two nodes' events line up as well as their wall clocks
agreed: 'cudatrace report' says whether each was synchronized (NTP, PTP)
and how closely, and warns where one was not.

Every process keeps its node (its host's name) and, in report, its job and
rank. A process whose PID a process of another node had is given a number
of its own above 4194304 (no real PID is that high); report shows the PID
it had on its node beside it. --pid takes the merged number, --rank a rank.

On the merged trace, report adds per job: each rank's peak and end memory,
how unevenly the ranks peaked, the first allocation that failed in the job
(rank, node, time and stack) and what every rank held at that moment.
docs/jobs.md says how to collect the traces (srun, ssh, Kubernetes).

An input cut short (a tracer killed) is merged up to its last complete
record, and said. A URL that cannot be fetched is left out with a warning.`,
		Example: `  # One trace per node, then one timeline
  cudatrace merge node-a.trace node-b.trace -o job.trace
  cudatrace report job.trace
  cudatrace export job.trace --format perfetto -o job.json   # one process per rank

  # The agents' windows of the next 60 seconds, from every node at once
  cudatrace merge --token-file token -o job.trace \
    'http://node-a:9738/trace?seconds=60' 'http://node-b:9738/trace?seconds=60'

  # One rank's memory snapshot
  cudatrace export job.trace --format memviz --rank 3 -o rank3.pickle`,
	}, (*mergeFlags).bind, runMerge)
}
