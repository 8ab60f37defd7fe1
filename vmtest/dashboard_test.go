package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/kube/kubetest"
)

// dashboardFile is the Grafana dashboard deploy/ ships.
const dashboardFile = "../deploy/grafana/cudatrace.json"

// gpanel is what the test reads of a Grafana panel.
type gpanel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []gpanel `json:"panels"` // a row's
}

// readDashboard reads the dashboard and checks its shape as Grafana
// (schema 39 and later) loads it: every panel on the datasource variable,
// placed, with PromQL targets; ids unique.
func readDashboard(t *testing.T) []gpanel {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID           string   `json:"uid"`
		Title         string   `json:"title"`
		SchemaVersion int      `json:"schemaVersion"`
		Panels        []gpanel `json:"panels"`
		Templating    struct {
			List []struct {
				Name, Type string
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 39 {
		t.Errorf("dashboard uid %q title %q schemaVersion %d: want both, and a current schema (39 or later)", d.UID, d.Title, d.SchemaVersion)
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
	}
	if vars["datasource"] != "datasource" || vars["job"] != "query" {
		t.Errorf("dashboard variables %v: want datasource (a datasource) and job (a query)", vars)
	}
	var out []gpanel
	ids := map[int]bool{}
	var walk func([]gpanel)
	walk = func(ps []gpanel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				walk(p.Panels)
				continue
			}
			if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" ||
				p.GridPos == nil || p.GridPos.W == 0 || p.GridPos.H == 0 || len(p.Targets) == 0 {
				t.Errorf("panel %q: datasource %+v, gridPos %+v, %d targets: want the ${datasource} Prometheus, a place, a query",
					p.Title, p.Datasource, p.GridPos, len(p.Targets))
			}
			out = append(out, p)
		}
	}
	walk(d.Panels)
	return out
}

// promVars are the dashboard variables a panel's query may hold, as this
// test sets them: Grafana's $__rate_interval (at least four scrape
// intervals) and the job variable.
var promVars = strings.NewReplacer("$__rate_interval", "10s", "${__rate_interval}", "10s", "$job", "cudatrace", "${job}", "cudatrace")

var unsetVar = regexp.MustCompile(`\$\{?[A-Za-z_]`)

// promSeries is one series of an instant query's answer.
type promSeries struct {
	labels map[string]string
	value  float64
}

func (s promSeries) String() string {
	var ls []string
	for k, v := range s.labels {
		ls = append(ls, k+"="+strconv.Quote(v))
	}
	sort.Strings(ls)
	return fmt.Sprintf("{%s} %v", strings.Join(ls, ","), s.value)
}

// promQuery runs an instant query against the Prometheus at base.
func promQuery(ctx context.Context, base, query string) ([]promSeries, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(query), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", query, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s: %s %s", query, r.Status, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, want a vector", query, r.Data.ResultType)
	}
	var out []promSeries
	for _, s := range r.Data.Result {
		v, _ := s.Value[1].(string)
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: value %q: %v", query, v, err)
		}
		out = append(out, promSeries{s.Metric, f})
	}
	return out, nil
}

// startPrometheus runs Debian's prometheus on a free loopback port, with
// its storage in dir, scraping target every second as job "cudatrace";
// relabel is appended to the scrape config (metric_relabel_configs). It
// is killed when the test ends. It returns the API's base URL.
func startPrometheus(t *testing.T, ctx context.Context, dir, target, relabel string) string {
	t.Helper()
	requireTool(t, "prometheus")
	port := freePort(t)
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: cudatrace
    static_configs:
      - targets: [%q]
%s`, target, relabel)
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	prom := exec.CommandContext(ctx, "prometheus", "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
	var promOut lockedBuffer
	prom.Stdout, prom.Stderr = &promOut, &promOut
	prom.Cancel = func() error { return prom.Process.Signal(syscall.SIGTERM) }
	prom.WaitDelay = 10 * time.Second
	if err := prom.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		prom.Process.Signal(syscall.SIGTERM)
		prom.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", truncate(promOut.String(), 8<<10))
		}
	})
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// TestDashboard: every query of the Grafana dashboard in deploy/grafana,
// run by a real Prometheus (Debian's) scraping an agent that traces two
// jobs, returns the series a user reads there, exact against the
// stand-in's ground truth: a job in pod ml/train-0 (named by a fake
// kubelet) on GPU 0 and one on the host on GPU 1, both allocating from
// load_weights, the pod's job then failing for lack of memory. Series of
// other processes on this machine (other tests' stand-ins) are dropped
// at the scrape.
//
// The owner panel may be empty: the owner label is issue 22's item 1,
// another branch; once it lands, its series must add up to the traced
// total.
func TestDashboard(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	requireTool(t, "prometheus")
	panels := readDashboard(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	const (
		uid = "0d5a1f2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"
		id  = "dddd1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	)
	parent := kubepods(t, "kubepods-cudatrace-dashboard")
	cg := podCgroup(t, parent, uid, id)
	sock := filepath.Join(dir, "kubelet.sock")
	srv, err := kubetest.Serve(sock, kubetest.Pod("ml", "train-0", kubetest.Container("trainer", "nvidia.com/gpu", "GPU-fake-0")))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	procs := filepath.Join(dir, "nvml-procs")
	ag := startAgentEnv(t, ctx, []string{"LD_LIBRARY_PATH=" + fakeNVMLDir, "FAKENVML_PROCS=" + procs},
		"--lib", fakeLib, "--dump-dir", "", "--pod-resources-socket", sock)

	logA, logH := filepath.Join(dir, "a.log"), filepath.Join(dir, "h.log")
	jA := startJob(t, ctx, logA)
	moveTo(t, cg, jA.pid)
	jH := startJob(t, ctx, logH)
	jA.do(t, "ok", "weights %d 0", 123456)
	jA.do(t, "ok", "step %d", 4096)
	jH.do(t, "ok", "weights %d 1", 7777)
	liveA, liveH := onlyTruth(t, logA, "").Devices[0].Live, onlyTruth(t, logH, "").Devices[1].Live
	if liveA != 123456 || liveH != 7777 {
		t.Fatalf("ground truth: live %d and %d, want 123456 and 7777", liveA, liveH)
	}
	// The driver charges each its allocations and a context.
	const ctxA, ctxH = 300 << 20, 100 << 20
	if err := os.WriteFile(procs, []byte(fmt.Sprintf("%d 0 %d\n%d 1 %d\n", jA.pid, liveA+ctxA, jH.pid, liveH+ctxH)), 0o644); err != nil {
		t.Fatal(err)
	}
	// Only these two jobs' series, and the agent's own.
	relabel := fmt.Sprintf(`    metric_relabel_configs:
      - source_labels: [pid]
        regex: "|%d|%d"
        action: keep
`, jA.pid, jH.pid)
	prom := startPrometheus(t, ctx, dir, strings.TrimPrefix(ag.url, "http://"), relabel)

	a, h := strconv.Itoa(jA.pid), strconv.Itoa(jH.pid)
	// Failures once Prometheus has scraped the job by its pod's name: a
	// rate sees them.
	waitProm(t, ctx, prom, `cudatrace_live_bytes{pod="train-0"}`)
	time.Sleep(2 * time.Second)
	for i := 0; i < 3; i++ {
		jA.do(t, "oom", "grow %d", 2*fakeMemLimit)
	}
	gpu0 := map[string]string{"gpu": "0", "UUID": "GPU-fake-0"}
	gpu1 := map[string]string{"gpu": "1", "UUID": "GPU-fake-1"}
	stackPrefix := "load_weights (agentload.c:"
	podA := map[string]string{"namespace": "ml", "pod": "train-0", "comm": "agentload", "pid": a}
	hostH := map[string]string{"comm": "agentload", "pid": h}
	type want struct {
		series []promSeries // exact labels and values, in any order
		check  func([]promSeries) string
	}
	exact := func(ss ...promSeries) want { return want{series: ss} }
	s := func(labels map[string]string, v float64) promSeries { return promSeries{labels, v} }
	wants := map[string]want{
		"GPU memory by GPU/A":   exact(s(gpu0, float64(liveA)), s(gpu1, float64(liveH))),
		"GPU memory by GPU/B":   exact(s(gpu0, float64(liveA+ctxA)), s(gpu1, float64(liveH+ctxH))),
		"GPU memory by pod/A":   exact(s(map[string]string{"namespace": "ml", "pod": "train-0"}, float64(liveA))),
		"GPU memory by owner/A": {check: ownerCheck(float64(liveA + liveH))},
		"GPU memory by stack (top 10)/A": {check: func(ss []promSeries) string {
			if len(ss) != 1 || !strings.HasPrefix(ss[0].labels["stack"], stackPrefix) || ss[0].value != float64(liveA+liveH) {
				return fmt.Sprintf("want one series, stack starting %q, %d bytes (both jobs' weights)", stackPrefix, liveA+liveH)
			}
			return ""
		}},
		"Driver's figure not traced (NVML remainder)/A": exact(s(gpu0, ctxA), s(gpu1, ctxH)),
		"Allocation failures/A":                         {check: failureCheck(podA, hostH)},
		"Allocation failures/B":                         {check: failureCheck(podA, hostH)},
		// The agent's own count, which other tests' processes on this
		// machine (traced too: the agent traces every process) may raise:
		// the series, by instance, not its value.
		"Lost events/A": {check: func(ss []promSeries) string {
			instance := map[string]string{"instance": strings.TrimPrefix(ag.url, "http://")}
			if len(ss) != 1 || sameSeries([]promSeries{{ss[0].labels, 0}}, []promSeries{{instance, 0}}) != "" || !(ss[0].value >= 0) {
				return fmt.Sprintf("want one series %v, a rate of 0 or more", instance)
			}
			return ""
		}},
	}

	// Every target of every panel has its expectation, and no other.
	seen := map[string]bool{}
	type query struct{ key, expr string }
	var queries []query
	for _, p := range panels {
		for _, tg := range p.Targets {
			key := p.Title + "/" + tg.RefID
			seen[key] = true
			if _, ok := wants[key]; !ok {
				t.Errorf("panel target %s (%s) has no expectation in this test", key, tg.Expr)
				continue
			}
			expr := promVars.Replace(tg.Expr)
			if unsetVar.MatchString(expr) {
				t.Errorf("%s: a variable this test does not set: %s", key, tg.Expr)
				continue
			}
			queries = append(queries, query{key, expr})
		}
	}
	for key := range wants {
		if !seen[key] {
			t.Errorf("no panel target %s in %s", key, dashboardFile)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// Until each query returns what it should (the scrapes and the rate
	// windows catch up), 30 s at most.
	last := map[string]string{}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Second) {
		for _, q := range queries {
			if last[q.key] == "ok" {
				continue
			}
			got, err := promQuery(ctx, prom, q.expr)
			if err != nil {
				last[q.key] = err.Error()
				continue
			}
			w := wants[q.key]
			msg := ""
			if w.check != nil {
				msg = w.check(got)
			} else {
				msg = sameSeries(got, w.series)
			}
			if msg == "" {
				last[q.key] = "ok"
			} else {
				last[q.key] = fmt.Sprintf("%s\n    query %s\n    got %v", msg, q.expr, got)
			}
		}
		done := true
		for _, q := range queries {
			done = done && last[q.key] == "ok"
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			for _, q := range queries {
				if last[q.key] != "ok" {
					t.Errorf("%s: %s", q.key, last[q.key])
				}
			}
			for _, l := range strings.Split(string(get(t, ctx, ag.url+"/metrics", http.StatusOK)), "\n") {
				if strings.Contains(l, "pid=\""+a+"\"") || strings.Contains(l, "pid=\""+h+"\"") {
					t.Logf("the agent: %s", l)
				}
			}
			break
		}
	}
	jA.end(t)
	jH.end(t)
	ag.stop(t)
}

// sameSeries says how got differs from want (labels and values exact, in
// any order); "" when it does not.
func sameSeries(got, want []promSeries) string {
	str := func(ss []promSeries) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.String())
		}
		sort.Strings(out)
		return out
	}
	g, w := str(got), str(want)
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		return fmt.Sprintf("want %v", w)
	}
	return ""
}

// ownerCheck accepts no series (the owner label not there yet), or owners
// whose bytes add up to total.
func ownerCheck(total float64) func([]promSeries) string {
	return func(ss []promSeries) string {
		var sum float64
		for _, s := range ss {
			if s.labels["owner"] == "" {
				return "a series without an owner"
			}
			sum += s.value
		}
		if len(ss) > 0 && sum != total {
			return fmt.Sprintf("owners add up to %v, want %v", sum, total)
		}
		return ""
	}
}

// failureCheck wants two series: the pod's job failing (a positive rate)
// and the host's job not (0).
func failureCheck(pod, host map[string]string) func([]promSeries) string {
	return func(ss []promSeries) string {
		if len(ss) != 2 {
			return "want two series: the pod's job's and the host's job's"
		}
		var okPod, okHost bool
		for _, s := range ss {
			switch {
			case sameSeries([]promSeries{{s.labels, 0}}, []promSeries{{pod, 0}}) == "":
				okPod = s.value > 0
			case sameSeries([]promSeries{{s.labels, 0}}, []promSeries{{host, 0}}) == "":
				okHost = s.value == 0
			}
		}
		if !okPod || !okHost {
			return fmt.Sprintf("want %v above 0 and %v at 0", pod, host)
		}
		return ""
	}
}

// waitProm waits (30 s at most) for query to return a series.
func waitProm(t *testing.T, ctx context.Context, base, query string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		got, err := promQuery(ctx, base, query)
		if err == nil && len(got) > 0 {
			return
		}
		last = fmt.Sprint(got, err)
	}
	t.Fatalf("Prometheus never returned %s within 30s; last: %s", query, last)
}
