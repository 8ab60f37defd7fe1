package httpapi

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/agent"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/record"
)

// nvmlSample is the driver's view the session hands over: one device,
// and the traced process on it.
var nvmlSample = &gpustat.Sample{
	Devices:   []gpustat.Device{{Index: 0, UUID: "GPU-aaaa", Total: 1000, Used: 500, Free: 500}},
	Processes: []gpustat.ProcessUsage{{PID: uint32(os.Getpid()), Device: 0, UUID: "GPU-aaaa", Used: 300}},
}

// serve runs an agent fed with one process's events, ticking as a session
// does, behind the HTTP handler.
func serve(t *testing.T, opts Options) *httptest.Server {
	t.Helper()
	a := agent.New(agent.Options{NoSymbolize: true})
	led := ledger.New()
	pid := uint32(os.Getpid())
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.Process(&procmodel.Capture{PID: pid, Comm: "job", Job: &jobid.Identity{Job: "slurm:42.0", Rank: 3, LocalRank: 1, NodeRank: -1}})
		for _, ev := range []events.Event{
			{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 100, Device: 0, Stack: []uint64{1}},
			{PID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x2000, Size: 40, Device: 1, Stack: []uint64{2}},
			{PID: pid, Comm: "job", API: events.TorchMalloc, Addr: 0x1000, Size: 60, Device: 0, Stack: []uint64{3}},
			{PID: pid, Comm: "job", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{4}},
		} {
			ch := led.Apply(&ev)
			a.Event(&ev, ch)
		}
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				a.Tick(&record.Result{Ledger: led, Events: 4, Lost: 2, NVML: nvmlSample})
			}
		}
	}()
	srv := httptest.NewUnstartedServer(New(a, opts))
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(func() { srv.Close(); close(stop); <-done; a.Close() })
	return srv
}

func fetch(t *testing.T, url string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if len(header) == 2 {
		req.Header.Set(header[0], header[1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestMetrics(t *testing.T) {
	srv := serve(t, Options{Version: "v9", ProcessLabels: true})
	code, body := fetch(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	// The exposition sorts labels by name.
	// Outside a pod the IDs and the kubelet's names are empty.
	pid := fmt.Sprintf(`namespace="",pid="%d",pod="",pod_uid="",rank="3"`, os.Getpid())
	pl := `comm="job",container="",container_id="",job_id="slurm:42.0",` + pid
	for _, want := range []string{
		`cudatrace_build_info{goversion="go`,
		`cudatrace_live_bytes{UUID="GPU-aaaa",comm="job",container="",container_id="",gpu="0",job_id="slurm:42.0",level="segment",` + pid + `} 100`,
		`cudatrace_live_bytes{UUID="GPU-aaaa",comm="job",container="",container_id="",gpu="0",job_id="slurm:42.0",level="tensor",` + pid + `} 60`,
		`cudatrace_live_bytes{UUID="",comm="job",container="",container_id="",gpu="1",job_id="slurm:42.0",level="segment",` + pid + `} 40`,
		`cudatrace_peak_bytes{UUID="",comm="job",container="",container_id="",gpu="1",job_id="slurm:42.0",level="segment",` + pid + `} 40`,
		`cudatrace_allocations_total{comm="job",container="",container_id="",job_id="slurm:42.0",level="segment",` + pid + `} 2`,
		`cudatrace_allocations_total{comm="job",container="",container_id="",job_id="slurm:42.0",level="tensor",` + pid + `} 1`,
		`cudatrace_allocation_failures_total{` + pl + `} 1`,
		`cudatrace_oom_total{` + pl + `} 1`,
		`cudatrace_allocated_bytes_total{` + pl + `} 140`,
		"cudatrace_lost_events_total 2",
		"cudatrace_events_total 4",
		"cudatrace_processes 1",
		`cudatrace_nvml_used_bytes{UUID="GPU-aaaa",gpu="0"} 500`,
		`cudatrace_nvml_total_bytes{UUID="GPU-aaaa",gpu="0"} 1000`,
		`cudatrace_nvml_process_used_bytes{UUID="GPU-aaaa",comm="job",container="",container_id="",gpu="0",job_id="slurm:42.0",` + pid + `} 300`,
		"cudatrace_nvml_up 1",
		// Each stack's live segments per device; the fake stacks name no frame.
		`cudatrace_stack_live_bytes{UUID="GPU-aaaa",comm="job",container="",container_id="",gpu="0",job_id="slurm:42.0",` + pid + `,stack="?"} 100`,
		`cudatrace_stack_live_bytes{UUID="",comm="job",container="",container_id="",gpu="1",job_id="slurm:42.0",` + pid + `,stack="?"} 40`,
		"# TYPE cudatrace_allocations_total counter",
		"# TYPE cudatrace_live_bytes gauge",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestMetricsWithoutProcessLabels(t *testing.T) {
	srv := serve(t, Options{ProcessLabels: false})
	_, body := fetch(t, srv.URL+"/metrics")
	for _, want := range []string{
		`cudatrace_live_bytes{UUID="GPU-aaaa",gpu="0",level="segment"} 100`,
		`cudatrace_live_bytes{UUID="GPU-aaaa",gpu="0",level="tensor"} 60`,
		`cudatrace_peak_bytes{UUID="",gpu="1",level="segment"} 40`,
		`cudatrace_allocations_total{level="segment"} 2`,
		"cudatrace_allocation_failures_total 1",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "pid=") || strings.Contains(body, "job_id=") || strings.Contains(body, "rank=") {
		t.Errorf("/metrics has per-process labels:\n%s", body)
	}
}

func TestEndpoints(t *testing.T) {
	srv := serve(t, Options{Token: "tok"})
	if code, _ := fetch(t, srv.URL+"/metrics"); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	auth := []string{"Authorization", "Bearer tok"}
	pid := os.Getpid()
	for _, c := range []struct {
		path string
		code int
		has  string
	}{
		{"/", 200, "/debug/pprof/cuda_memory"},
		{"/debug/pprof/cuda_memory", 200, ""},
		{fmt.Sprintf("/debug/pprof/cuda_memory?pid=%d", pid), 200, ""},
		{"/debug/pprof/cuda_memory?pid=x", 400, "want a process ID"},
		{"/debug/pprof/cuda_memory?pid=424242424", 404, "no such traced process"},
		{fmt.Sprintf("/snapshot?pid=%d", pid), 200, "segments"},
		{"/snapshot", 400, "?pid= is required"},
		{"/trace?seconds=0", 400, "want a number of seconds"},
		{"/trace?pid=424242424&seconds=1", 404, "no such traced process"},
		{"/nothing", 404, ""},
	} {
		code, body := fetch(t, srv.URL+c.path, auth...)
		if code != c.code || !strings.Contains(body, c.has) {
			t.Errorf("%s: %d %.200q, want %d with %q", c.path, code, body, c.code, c.has)
		}
	}
}
