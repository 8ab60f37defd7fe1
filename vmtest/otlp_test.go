package vmtest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

// The OpenTelemetry Collector of these tests is built from upstream's
// modules (otelcol/: the OTLP receiver and the file exporter), in a module
// of its own, into a cache outside the checkout keyed by its sources: the
// first run builds it (minutes), later ones reuse it.
var (
	otelcolOnce sync.Once
	otelcolBin  string
	otelcolErr  error
)

func otelcolCache() string {
	if d := os.Getenv("CUDATRACE_KERNEL_CACHE"); d != "" {
		return filepath.Join(d, "otelcol")
	}
	return "/var/cache/cudatrace-vmtest/otelcol"
}

// needOtelcol returns the built Collector.
func needOtelcol(t *testing.T) string {
	t.Helper()
	otelcolOnce.Do(func() {
		src, err := filepath.Abs("otelcol")
		if err != nil {
			otelcolErr = err
			return
		}
		h := sha256.New()
		for _, f := range []string{"go.mod", "go.sum", "main.go"} {
			b, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				otelcolErr = err
				return
			}
			fmt.Fprintf(h, "%s %d\n", f, len(b))
			h.Write(b)
		}
		out, _ := exec.Command(goTool(), "env", "GOVERSION").Output()
		h.Write(out)
		dir := filepath.Join(otelcolCache(), hex.EncodeToString(h.Sum(nil))[:16])
		bin := filepath.Join(dir, "otelcol")
		if _, err := os.Stat(bin); err == nil {
			otelcolBin = bin
			return
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			otelcolErr = err
			return
		}
		tmp := bin + ".tmp" + strconv.Itoa(os.Getpid())
		cmd := exec.Command(goTool(), "build", "-trimpath", "-o", tmp, ".")
		cmd.Dir = src
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			otelcolErr = fmt.Errorf("building the test Collector (vmtest/otelcol): %v\n%s", err, out)
			return
		}
		if err := os.Rename(tmp, bin); err != nil {
			otelcolErr = err
			return
		}
		otelcolBin = bin
	})
	if otelcolErr != nil {
		testenv.SkipOrFail(t, "%v", otelcolErr)
	}
	return otelcolBin
}

// collector is a running test Collector: OTLP in (gRPC and HTTP), every
// profiles request it took written as a JSON line to out.
type collector struct {
	bin, dir, out      string
	grpcAddr, httpAddr string
	cmd                *exec.Cmd
	log                *lockedBuffer
}

func startCollector(t *testing.T, bin string) *collector {
	t.Helper()
	dir := t.TempDir()
	c := &collector{bin: bin, dir: dir, out: filepath.Join(dir, "profiles.jsonl"),
		grpcAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), httpAddr: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  file:
    path: %s
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file]
`, c.grpcAddr, c.httpAddr, c.out)
	if err := os.WriteFile(filepath.Join(dir, "config.yaml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(t)
	t.Cleanup(func() { c.stop() })
	return c
}

// start runs the Collector and waits until both receivers listen.
func (c *collector) start(t *testing.T) {
	t.Helper()
	c.cmd = exec.Command(c.bin, "--config", filepath.Join(c.dir, "config.yaml"), "--feature-gates=service.profilesSupport")
	c.log = newLockedBuffer("")
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(c.log.String(), "Everything is ready"); {
		if time.Now().After(deadline) {
			c.stop()
			t.Fatalf("the Collector did not start:\n%s", c.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *collector) stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	c.cmd.Wait()
	c.cmd = nil
}

// received reads every request the Collector wrote.
func (c *collector) received(t *testing.T) []pprofile.Profiles {
	t.Helper()
	f, err := os.Open(c.out)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []pprofile.Profiles
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	var bad error
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		if bad != nil {
			t.Fatalf("the Collector's file: %v", bad)
		}
		pd, err := (&pprofile.JSONUnmarshaler{}).UnmarshalProfiles(sc.Bytes())
		if err != nil {
			bad = err // the last line may be one the Collector is writing
			continue
		}
		out = append(out, pd)
	}
	return out
}

// pprofByStack sums a pprof profile's values of one sample type by pid and
// stack (frames as export.OTLPTotals writes them), and keeps each pid's
// labels.
func pprofByStack(p *profile.Profile, typ string) (map[int64]map[string]int64, map[int64]map[string]string) {
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == typ {
			idx = i
		}
	}
	vals, labels := map[int64]map[string]int64{}, map[int64]map[string]string{}
	for _, s := range p.Sample {
		pid := s.NumLabel["pid"][0]
		var frames []string
		for _, loc := range s.Location {
			if len(loc.Line) == 0 {
				frames = append(frames, "0x"+strconv.FormatUint(loc.Address, 16))
			}
			for _, ln := range loc.Line {
				f := ln.Function.Name
				if ln.Line != 0 {
					f += ":" + strconv.FormatInt(ln.Line, 10)
				}
				frames = append(frames, f)
			}
		}
		if vals[pid] == nil {
			vals[pid] = map[string]int64{}
			labels[pid] = map[string]string{}
		}
		if s.Value[idx] != 0 {
			vals[pid][strings.Join(frames, ";")+" "+s.Label["device"][0]] += s.Value[idx]
		}
		for k, v := range s.Label {
			labels[pid][k] = v[0]
		}
	}
	return vals, labels
}

// otlpByStack is pprofByStack of OTLP profiles read back.
func otlpByStack(p *export.OTLPProcess, typ string) map[string]int64 {
	out := map[string]int64{}
	for _, s := range p.Stacks[typ] {
		out[s.Frames+" "+s.Attrs["device"]] += s.Value
	}
	return out
}

// sameAsPprof checks that the latest push of each process in got holds the
// live set (inuse_space, inuse_objects by stack) and labels of the pprof
// profile p.
func sameAsPprof(t *testing.T, latest map[int64]*export.OTLPProcess, p *profile.Profile, pids ...int) {
	t.Helper()
	for _, typ := range []string{"inuse_space", "inuse_objects"} {
		want, labels := pprofByStack(p, typ)
		for _, pid := range pids {
			op := latest[int64(pid)]
			if op == nil {
				t.Errorf("pid %d: no OTLP profile received", pid)
				continue
			}
			got := otlpByStack(op, typ)
			if fmt.Sprint(got) != fmt.Sprint(want[int64(pid)]) {
				t.Errorf("pid %d %s by stack: OTLP %v, pprof %v", pid, typ, got, want[int64(pid)])
			}
			for label, attr := range export.OTLPResourceAttrs {
				if v := labels[int64(pid)][label]; v != "" && op.Resource[attr] != v {
					t.Errorf("pid %d: resource %s = %q, pprof's %s = %q", pid, attr, op.Resource[attr], label, v)
				}
			}
			if op.Resource["process.pid"] != strconv.Itoa(pid) || op.Resource["host.name"] == "" {
				t.Errorf("pid %d: resource %v", pid, op.Resource)
			}
		}
	}
}

// latestByPID is each process's latest push among reqs (a process absent
// from a push, nothing live and nothing allocated, keeps its older one),
// and the sum of every push's alloc_*.
func latestByPID(reqs []pprofile.Profiles) (map[int64]*export.OTLPProcess, map[int64]map[string]int64) {
	latest, allocs := map[int64]*export.OTLPProcess{}, map[int64]map[string]int64{}
	for _, r := range reqs {
		for pid, p := range export.OTLPTotals(r) {
			latest[pid] = p
			if allocs[pid] == nil {
				allocs[pid] = map[string]int64{}
			}
			for k, v := range p.Values {
				if strings.HasPrefix(k, "alloc_") {
					allocs[pid][k] += v
				}
			}
		}
	}
	return latest, allocs
}

func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n << 10
		}
	}
	return 0
}

// TestAgentOTLP: the agent's pushes reach a real OpenTelemetry Collector,
// and hold what its pprof endpoint says; a Collector that goes away costs
// counted pushes, not the tracing or the agent's memory.
func TestAgentOTLP(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	bin := needOtelcol(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	col := startCollector(t, bin)
	dir := t.TempDir()
	log := filepath.Join(dir, "fake.log")
	ag := startAgent(t, ctx, "--dump-dir", "", "--otlp-endpoint", col.grpcAddr, "--otlp-insecure",
		"--otlp-interval", "300ms", "--otlp-queue-size", "16KiB", "--otlp-resource-attr", "k8s.cluster.name=test")

	a := startJob(t, ctx, log, "RANK=1", "WORLD_SIZE=2", "TORCHELASTIC_RUN_ID=otlp-job")
	a.do(t, "ok", "weights %d 0", 1000000)
	a.do(t, "ok", "weights %d 1", 3000000)
	a.do(t, "ok", "step %d", 5000)
	b := startJob(t, ctx, log)
	b.do(t, "ok", "weights %d 0", 777)

	// Quiet now: once a push after the last event arrived, the live sets
	// it holds are the pprof endpoint's.
	settled := func(t *testing.T, reqs int) (map[int64]*export.OTLPProcess, map[int64]map[string]int64) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := col.received(t)
			if len(got) >= reqs {
				latest, allocs := latestByPID(got)
				if latest[int64(a.pid)] != nil && latest[int64(b.pid)] != nil {
					return latest, allocs
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("the Collector got %d requests in 60s:\n%s", len(got), col.log.String())
			}
			time.Sleep(300 * time.Millisecond)
		}
	}
	time.Sleep(time.Second) // two pushes after the last event
	n := len(col.received(t))
	latest, allocs := settled(t, n+1)
	p := fetchProfile(t, ctx, ag.url+"/debug/pprof/cuda_memory")
	sameAsPprof(t, latest, p, a.pid, b.pid)
	truths, err := groundTruthFile(log, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range []*job{a, b} {
		tr := truths[j.pid]
		if got := allocs[int64(j.pid)]; got["alloc_objects"] != int64(tr.Allocs) || got["alloc_space"] != int64(tr.AllocBytes) {
			t.Errorf("pid %d: the pushes' alloc_* add up to %v, want %d allocations of %d bytes", j.pid, got, tr.Allocs, tr.AllocBytes)
			for i, r := range col.received(t) {
				if p := export.OTLPTotals(r)[int64(j.pid)]; p != nil {
					t.Logf("push %d: %v", i, p.Values)
				}
			}
		}
	}
	ra := latest[int64(a.pid)].Resource
	if ra["cudatrace.job.rank"] != "1" || ra["cudatrace.job.id"] != "torchrun:otlp-job" || ra["k8s.cluster.name"] != "test" ||
		!strings.Contains(ra["process.command_args"], "agentload") {
		t.Errorf("rank 1's resource: %v", ra)
	}

	// The Collector goes away: the agent keeps tracing, within its memory,
	// and counts what it could not send.
	col.stop()
	before := rss(t, ag.cmd.Process.Pid)
	for i := range 40 {
		a.do(t, "ok", "step %d", 1000+i)
		time.Sleep(100 * time.Millisecond)
	}
	a.do(t, "ok", "weights %d 0", 2000)
	var m []sample
	deadline := time.Now().Add(30 * time.Second)
	for {
		m = parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
		if v, _ := metric(t, m, "cudatrace_otlp_dropped_total"); v > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no push counted as dropped with the Collector down:\n%s", truncate(ag.stderr.String(), 4096))
		}
		time.Sleep(300 * time.Millisecond)
	}
	if v, _ := metric(t, m, "cudatrace_otlp_failures_total"); v == 0 {
		t.Errorf("cudatrace_otlp_failures_total = 0 with the Collector down")
	}
	if v, _ := metric(t, m, "cudatrace_otlp_queue_bytes"); v > 2*16<<10 {
		t.Errorf("cudatrace_otlp_queue_bytes = %v, past the 16KiB queue and one push", v)
	}
	wantMetric(t, m, 0, "cudatrace_lost_events_total")
	wantMetric(t, m, 1+1+1+40+1, "cudatrace_allocations_total", "pid", strconv.Itoa(a.pid), "level", "segment")
	if after := rss(t, ag.cmd.Process.Pid); after-before > 32<<20 {
		t.Errorf("the agent's RSS grew %d MiB with the Collector down (%d -> %d)", (after-before)>>20, before>>20, after>>20)
	} else {
		t.Logf("agent RSS with the Collector down: %d MiB -> %d MiB", before>>20, after>>20)
	}
	if !strings.Contains(ag.stderr.String(), "OTLP export to "+col.grpcAddr) {
		t.Errorf("the agent did not say the Collector failed")
	}

	// Back: the pushes arrive again, with the live set of now.
	os.Remove(col.out)
	col.start(t)
	settled(t, 2) // the pushes arrive again
	time.Sleep(time.Second)
	latest, _ = settled(t, len(col.received(t))+1)
	p = fetchProfile(t, ctx, ag.url+"/debug/pprof/cuda_memory")
	sameAsPprof(t, latest, p, a.pid, b.pid)
	a.end(t)
	b.end(t)
	ag.stop(t)
}

// TestExportOTLP: `export --format otlp` sends a trace's profile to the
// Collector, over gRPC and over HTTP, holding what `--format pprof` writes;
// with no Collector it fails, saying so, after its retries.
func TestExportOTLP(t *testing.T) {
	bin := needOtelcol(t)
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "mix.trace")
	pb := filepath.Join(dir, "mix.pb.gz")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv(log)}, "--lib", fakeLib, "-o", trace,
		"--export", "pprof="+pb, "--", workload("mix"), "3", "200", "11")
	rec.finish(t, 50*time.Second)
	want := onlyTruth(t, log, "")
	f, err := os.Open(pb)
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	col := startCollector(t, bin)
	for _, tc := range []struct{ name, endpoint, proto string }{
		{"grpc", col.grpcAddr, "grpc"},
		{"http", "http://" + col.httpAddr, "http/protobuf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n0 := len(col.received(t)) // the Collector keeps its file open: read past what it held
			out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "otlp", "--otlp-insecure",
				"--otlp-endpoint", tc.endpoint, "--otlp-protocol", tc.proto).CombinedOutput()
			if err != nil {
				t.Fatalf("export: %v\n%s", err, out)
			}
			var reqs []pprofile.Profiles
			for deadline := time.Now().Add(20 * time.Second); len(reqs) == 0 && time.Now().Before(deadline); {
				time.Sleep(200 * time.Millisecond)
				reqs = col.received(t)[n0:]
			}
			if len(reqs) != 1 {
				t.Fatalf("the Collector wrote %d requests, want 1:\n%s", len(reqs), col.log.String())
			}
			got := export.OTLPTotals(reqs[0])
			op := got[int64(want.PID)]
			if op == nil {
				t.Fatalf("no profile of pid %d: %v", want.PID, got)
			}
			if op.Values["alloc_objects"]+op.Values["host_alloc_objects"] != int64(want.Allocs) ||
				op.Values["inuse_space"] != int64(want.Live) {
				t.Errorf("totals %v, want %d allocations and %d bytes live", op.Values, want.Allocs, want.Live)
			}
			for _, typ := range []string{"inuse_space", "alloc_space"} {
				w, _ := pprofByStack(p, typ)
				if g := otlpByStack(op, typ); fmt.Sprint(g) != fmt.Sprint(w[int64(want.PID)]) {
					t.Errorf("%s by stack: OTLP %v, pprof %v", typ, g, w[int64(want.PID)])
				}
			}
		})
	}
	col.stop()
	start := time.Now()
	out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "otlp", "--otlp-insecure",
		"--otlp-endpoint", col.grpcAddr).CombinedOutput()
	if err == nil || !strings.Contains(string(out), col.grpcAddr) {
		t.Errorf("export to a Collector that is down: %v\n%s", err, out)
	}
	t.Logf("export with the Collector down failed after %v: %s", time.Since(start).Round(time.Second), strings.TrimSpace(string(out)))
}
