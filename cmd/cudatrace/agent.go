package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/cudatrace/cudatrace/agent"
	"github.com/cudatrace/cudatrace/agent/httpapi"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
)

type agentFlags struct {
	traceFlags
	listen        string
	tokenFile     string
	noToken       bool
	retention     time.Duration
	dumpDir       string
	dumpEvery     time.Duration
	processLabels bool
	maxWindows    int
	historyEvents int
	historyBudget string
	podResources  string
	criSocket     string
	otlpFlags
	otlpInterval time.Duration
	otlpQueue    string
}

func (f *agentFlags) bind(fl *pflag.FlagSet) {
	fl.StringVar(&f.listen, "listen", "127.0.0.1:9738", "HTTP address to serve on (port 0 picks a free one)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bearer token every request must carry (without one: only root and the agent's user, over loopback)")
	fl.BoolVar(&f.noToken, "insecure-no-token", false, "serve anyone who reaches the port without a token, other local users and off loopback included (they read stacks and command lines)")
	fl.DurationVar(&f.retention, "retention", agent.DefaultRetention, "how long an exited process's account is kept")
	fl.StringVar(&f.dumpDir, "dump-dir", "/var/lib/cudatrace/oom", `where OOM dumps go ("" writes none)`)
	fl.DurationVar(&f.dumpEvery, "dump-every", agent.DefaultDumpEvery, "at most one OOM dump per process this often")
	fl.BoolVar(&f.processLabels, "process-labels", true, "label metrics with pid, comm, container_id, pod_uid, the kubelet's namespace, pod and container, and the job_id and rank of distributed jobs (off: summed per GPU)")
	f.add(fl, "leave the stacks of profiles, snapshots and OOM dumps as addresses", "export what the driver reports (NVML) beside what was traced")
	fl.IntVar(&f.historyEvents, "history-events", agent.DefaultHistoryEvents, "latest events kept per process for /snapshot and the OOM dumps (the flight recorder; 0: none)")
	fl.StringVar(&f.historyBudget, "history-budget", "128MiB", "memory all processes' histories may take together (the newest are kept)")
	fl.StringVar(&f.podResources, "pod-resources-socket", kube.DefaultSocket, `the kubelet's pod-resources socket, for the pod, namespace and container labels ("" reads none; absent: no names)`)
	fl.StringVar(&f.criSocket, "cri-socket", "auto", `the container runtime's CRI socket (containerd's, CRI-O's), for the names of every process in a pod by its own container; auto: the first of `+strings.Join(kube.CRISockets, ", ")+` that exists; "" asks none`)
	f.otlpFlags.bind(fl)
	fl.DurationVar(&f.otlpInterval, "otlp-interval", agent.DefaultOTLPInterval, "with --otlp-endpoint: how often the profiles are pushed (inuse_* the live set then, alloc_* the allocations since the last push)")
	fl.StringVar(&f.otlpQueue, "otlp-queue-size", "32MiB", "with --otlp-endpoint: the most encoded pushes kept while the receiver is down or slow (the oldest are dropped past it, and counted)")
	fl.IntVar(&f.maxWindows, "max-trace-windows", httpapi.DefaultMaxTraceWindows, "most /trace windows open at once (429 past it); each holds at most 4MiB of records for its client")
}

func runAgent(cmd *cobra.Command, f *agentFlags, _ []string) error {
	ring, err := f.ring(loader.DefaultStackWindow)
	if err != nil {
		return err
	}
	if f.maxWindows <= 0 {
		return hint.Wrap(fmt.Errorf("--max-trace-windows %d: must be positive", f.maxWindows), "e.g. --max-trace-windows 8")
	}
	if f.retention <= 0 {
		return hint.Wrap(fmt.Errorf("--retention %v: must be positive", f.retention), "e.g. --retention 10m")
	}
	if f.historyEvents < 0 {
		return hint.Wrap(fmt.Errorf("--history-events %d: must not be negative", f.historyEvents), "e.g. --history-events 100000, or 0 for none")
	}
	budget, err := parseBytes(f.historyBudget)
	if err != nil || budget == 0 || budget > 1<<40 {
		if err == nil {
			err = errors.New("must be between 1 byte and 1TiB")
		}
		return hint.Wrap(fmt.Errorf("--history-budget %q: %w", f.historyBudget, err), "e.g. --history-budget 256MiB")
	}
	// Before serving anything: an agent that cannot trace says why at once.
	if err := loader.CheckPIDNamespace(); err != nil {
		return err
	}
	historyEvents := f.historyEvents
	if historyEvents == 0 {
		historyEvents = -1 // agent.Options: negative is none
	}
	token, err := readToken(f.tokenFile)
	if err != nil {
		return err
	}
	if token == "" && !f.noToken && !loopback(f.listen) {
		return hint.Wrap(fmt.Errorf("--listen %s is not a loopback address, and no --token-file is given", f.listen),
			"give --token-file FILE (clients send Authorization: Bearer TOKEN), or --insecure-no-token if the network is trusted")
	}
	stderr := cmd.ErrOrStderr()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return hint.Wrap(fmt.Errorf("--listen %s: %w", f.listen, err), "choose a free address, e.g. --listen 127.0.0.1:9739")
	}
	var pods *kube.Lister
	if f.podResources != "" {
		pods = kube.Start(kube.Options{Socket: f.podResources, Stderr: stderr})
		defer pods.Close()
	}
	var runtime *kube.CRI
	if f.criSocket != "" {
		sock := f.criSocket
		if sock == "auto" {
			sock = ""
		}
		runtime = kube.StartCRI(kube.CRIOptions{Socket: sock, Stderr: stderr})
		defer runtime.Close()
	}
	aopts := agent.Options{Runtime: runtime, Retention: f.retention, DumpDir: f.dumpDir, DumpEvery: f.dumpEvery,
		HistoryEvents: historyEvents, HistoryBudget: int64(budget),
		NoSymbolize: f.noSymbolize, Pods: pods, NoTopStacks: !f.processLabels, Version: version, Stderr: stderr}
	if f.endpoint != "" {
		exp, err := f.exporter(stderr, f.otlpQueue, 0)
		if err != nil {
			return err
		}
		defer func() {
			// What is still queued gets a few seconds to go.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			exp.Close(ctx)
		}()
		if f.otlpInterval <= 0 {
			return hint.Wrap(fmt.Errorf("--otlp-interval %v: must be positive", f.otlpInterval), "e.g. --otlp-interval 15s")
		}
		if aopts.OTLPResource, err = f.resource(); err != nil {
			return err
		}
		aopts.OTLP, aopts.OTLPInterval = exp, f.otlpInterval
		fmt.Fprintf(stderr, "cudatrace agent: pushing OpenTelemetry profiles to %s (%s) every %v\n", f.endpoint, f.protocol, f.otlpInterval)
	}
	a := agent.New(aopts)
	srv := &http.Server{
		Handler: httpapi.New(a, httpapi.Options{Version: version, Token: token, Open: f.noToken,
			ProcessLabels: f.processLabels, MaxTraceWindows: f.maxWindows}),
		// Who is at the other end: without a token only root and this
		// user are served.
		ConnContext:       httpapi.ConnContext,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	// Runs before the shutdown: it ends the trace streams still open, and
	// writes the OOM dumps still queued.
	defer a.Close()
	fmt.Fprintf(stderr, "cudatrace agent: serving http://%s/ (the memory page: http://%s/ui)\n", ln.Addr(), ln.Addr())

	ctx, stop := context.WithCancel(cmd.Context())
	defer stop()
	go func() {
		// A server that stops serving stops the agent.
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(stderr, "cudatrace agent: http: %v\n", err)
			stop()
		}
	}()
	opts := record.Options{Libs: f.libs, All: true, Version: version, Stderr: stderr, Observer: a, NoPythonFrames: f.noPy}
	if f.nvml {
		opts.NVML = gpustat.Open
	}
	opts.Tracer.RingBytes = ring
	res, err := record.Run(ctx, opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "cudatrace agent: stopped (%s) after %d events, %d lost while serving (cudatrace_lost_events_total), %d while stopping\n",
		res.StopReason, res.Events, res.Lost-res.LostStopping, res.LostStopping)
	writeLosses(stderr, "cudatrace agent", res, ring)
	writePythonLosses(stderr, "cudatrace agent", res)
	return nil
}

// readToken reads the bearer token: the file's content, trimmed.
func readToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", hint.Wrap(fmt.Errorf("--token-file: %w", err), "the file holds the token on one line")
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", hint.Wrap(fmt.Errorf("--token-file %s is empty", path), "put the token on one line")
	}
	return t, nil
}

// loopback reports whether the listen address is on the loopback
// interface only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// newAgentCmd is `cudatrace agent`: its help, its flags (agentFlags.bind) and runAgent.
func newAgentCmd() *cobra.Command {
	return verb(&cobra.Command{
		Use:   "agent [flags]",
		Short: "Trace every CUDA process on this node and serve metrics, profiles and OOM dumps over HTTP",
		Long: `Agent is the always-on node daemon. It traces every CUDA process on the host
(processes and library copies that appear later included), keeps each one's
account in memory (an exited process is dropped after --retention), and
serves, on 127.0.0.1 unless --listen says otherwise:

  /metrics                          Prometheus metrics: live and peak bytes per
                                    process and GPU, allocations, failures, OOMs,
                                    lost events (labels gpu and UUID as DCGM's)
  /debug/pprof/cuda_memory[?pid=N]  pprof heap profile: inuse_* is the live GPU
                                    memory, alloc_* the allocations since the
                                    last scrape (Pyroscope/Alloy, Parca)
  /snapshot?pid=N                   PyTorch memory snapshot of one process
                                    (pytorch.org/memory_viz)
  /trace?pid=N&seconds=S            a trace file of the next S seconds, for
                                    'cudatrace report' and 'cudatrace export'

When an allocation fails with out of memory, the agent writes that
process's memory snapshot, a pprof profile of its live set and a JSON report
with the failing stack into --dump-dir (files mode 0600).

The agent keeps every process's latest events (--history-events, within
--history-budget for the node): /snapshot and every OOM dump carry them in
memory_viz's timeline, as torch.cuda.memory._record_memory_history would in
the process, for every CUDA process, without code changes, and after the
process died (kept as long as its account, --retention).

The stacks of CPython ` + pystack.Versions() + ` processes show their Python frames
(file:line:function) in place of the interpreter loop's, as 'cudatrace
report' does: the Python line that allocated, or failed to.

A process in a container is labelled with its container ID (container_id),
and under Kubernetes with its pod's UID (pod_uid; both from /proc/PID/cgroup)
and its namespace, pod and container names (namespace, pod, container, as
DCGM exporter spells them) from the kubelet's pod-resources socket
(--pod-resources-socket), when the GPUs it uses are allocated to its
container alone.

Access: what the agent serves (command lines, stacks, memory layouts of
every process on the node) is root's. Without --token-file only root and
the agent's own user are served, over loopback (the client socket's owner,
as the kernel's socket table says); every other local user gets 403. With
--token-file every request must carry Authorization: Bearer TOKEN (give
Prometheus, Alloy or Parca the token), and off loopback a token is
required unless --insecure-no-token serves anyone who reaches the port.
See docs/agent.md.`,
		Example: `  # On a GPU node, as root: metrics on 127.0.0.1:9738, OOM dumps in /var/lib/cudatrace/oom
  cudatrace agent

  # Scrape it
  curl -s localhost:9738/metrics | grep cudatrace_live_bytes
  go tool pprof -http :8080 http://127.0.0.1:9738/debug/pprof/cuda_memory
  curl -so job.pickle 'localhost:9738/snapshot?pid=4242'
  curl -so job.trace 'localhost:9738/trace?pid=4242&seconds=30' && cudatrace report job.trace

  # Serve on every address, with a token, and fewer series
  cudatrace agent --listen 0.0.0.0:9738 --token-file /etc/cudatrace/token --process-labels=false`,
		Args: cobra.NoArgs,
	}, (*agentFlags).bind, runAgent)
}
