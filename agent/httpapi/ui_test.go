package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/agent"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/browsertest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/record"
)

// uiData is what the tests read of the page's data.
type uiData struct {
	Version int `json:"version"`
	Live    struct {
		URL          string `json:"url"`
		EverySeconds int    `json:"every_seconds"`
	} `json:"live"`
	Processes []struct {
		PID       uint32 `json:"pid"`
		PeakBytes uint64 `json:"peak_bytes"`
	} `json:"processes"`
	Series []struct {
		Keys []struct {
			PID uint32 `json:"pid"`
			Dev *int32 `json:"dev"`
		} `json:"keys"`
		Level int    `json:"level"`
		Peak  uint64 `json:"peak"`
	} `json:"series"`
	Failures []struct {
		PID   uint32 `json:"pid"`
		Size  uint64 `json:"size"`
		Error string `json:"error"`
	} `json:"failures"`
	Notes []string `json:"notes"`
}

// peak is the data's series peak for pid (0 all) on every device.
func (d *uiData) peak(pid uint32, level int) uint64 {
	for _, s := range d.Series {
		for _, k := range s.Keys {
			if s.Level == level && k.PID == pid && k.Dev == nil {
				return s.Peak
			}
		}
	}
	return 0
}

// /ui answers the page, /ui/data its data, under the agent's access rules:
// the figures are the agent's (serve's events: 140 bytes of segments, a
// 60-byte tensor, a failed 1 TiB allocation).
func TestUI(t *testing.T) {
	srv := serve(t, Options{Token: "tok"})
	auth := []string{"Authorization", "Bearer tok"}
	pid := uint32(os.Getpid())
	for _, path := range []string{"/ui", "/ui/data", fmt.Sprintf("/ui?pid=%d", pid)} {
		if code, _ := fetch(t, srv.URL+path); code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, code)
		}
	}
	for _, c := range []struct {
		path string
		code int
		has  string
	}{
		{"/ui?pid=x", 400, "want a process ID"},
		{"/ui?pid=424242424", 404, "no such traced process"},
		{"/ui/data?pid=424242424", 404, "no such traced process"},
		{"/", 200, "/ui[?pid=N]"},
	} {
		if code, body := fetch(t, srv.URL+c.path, auth...); code != c.code || !strings.Contains(body, c.has) {
			t.Errorf("%s: %d %.200q, want %d with %q", c.path, code, body, c.code, c.has)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/ui", nil)
	req.Header.Set(auth[0], auth[1])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct, csp := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Security-Policy"); ct != "text/html; charset=utf-8" || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("/ui: Content-Type %q, Content-Security-Policy %q", ct, csp)
	}
	for _, path := range []string{"/ui/data", fmt.Sprintf("/ui/data?pid=%d", pid)} {
		code, body := fetch(t, srv.URL+path, auth...)
		var d uiData
		if err := json.Unmarshal([]byte(body), &d); code != 200 || err != nil {
			t.Fatalf("%s: %d %v %.200q", path, code, err, body)
		}
		wantURL := "ui/data"
		if strings.Contains(path, "pid") {
			wantURL += fmt.Sprintf("?pid=%d", pid)
		}
		if d.Version != 1 || d.Live.URL != wantURL || d.Live.EverySeconds != uiRefreshSeconds {
			t.Errorf("%s: version %d, refresh %+v", path, d.Version, d.Live)
		}
		if len(d.Processes) != 1 || d.Processes[0].PID != pid || d.Processes[0].PeakBytes != 140 {
			t.Errorf("%s: processes %+v", path, d.Processes)
		}
		if g, ts := d.peak(pid, 0), d.peak(pid, 1); g != 140 || ts != 60 {
			t.Errorf("%s: peaks %d (GPU memory), %d (tensors), want 140 and 60", path, g, ts)
		}
		if len(d.Failures) != 1 || d.Failures[0].Size != 1<<40 || d.Failures[0].Error != "cudaErrorMemoryAllocation" {
			t.Errorf("%s: failures %+v", path, d.Failures)
		}
	}
}

// liveAgent is an agent behind the HTTP handler whose events the test
// sends when it likes.
func liveAgent(t *testing.T) (*httptest.Server, func(events.Event)) {
	t.Helper()
	a := agent.New(agent.Options{NoSymbolize: true})
	led := ledger.New()
	evs := make(chan events.Event)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		a.Process(&procmodel.Capture{PID: uint32(os.Getpid()), Comm: "job"})
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case ev := <-evs:
				ch := led.Apply(&ev)
				a.Event(&ev, ch)
			case <-tick.C:
				a.Tick(&record.Result{Ledger: led})
			}
		}
	}()
	srv := httptest.NewUnstartedServer(New(a, Options{}))
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(func() { srv.Close(); close(stop); <-done; a.Close() })
	send := func(ev events.Event) {
		ev.PID, ev.TID, ev.Comm, ev.Time, ev.Duration = uint32(os.Getpid()), uint32(os.Getpid()), "job", record.BootNow(), 1
		evs <- ev
	}
	return srv, send
}

// In a real browser, /ui shows the agent's memory and, as the process
// allocates more, refreshes to show it, with no error and no request but
// its own.
func TestUIRefreshesInChromium(t *testing.T) {
	defer func(s int) { uiRefreshSeconds = s }(uiRefreshSeconds)
	uiRefreshSeconds = 1
	srv, send := liveAgent(t)
	send(events.Event{API: events.CudaMalloc, Addr: 0x1000, Size: 3 << 20, Device: 0, Stack: []uint64{0xa1}})
	b := browsertest.Start(t) // root, over loopback: served without a token
	url := srv.URL + "/ui"
	b.Open(t, url, 30*time.Second)
	if s := b.Text(t, "#summary"); !strings.Contains(s, "peak 3.0 MiB") {
		t.Fatalf("/ui shows %q, want a peak of 3.0 MiB", s)
	}
	send(events.Event{API: events.CudaMalloc, Addr: 0x9000000, Size: 5 << 20, Device: 0, Stack: []uint64{0xa2}})
	b.Wait(t, `cudatrace.refreshes >= 1 && document.getElementById('summary').textContent.includes('peak 8.0 MiB')`, 15*time.Second)
	if live := b.Text(t, "#live"); !strings.HasPrefix(live, "live: updated ") {
		t.Errorf("the page says %q of its refresh", live)
	}
	// By call path, each path keeps its colour across refreshes, though a
	// larger one comes first; the owners table is filled, as exported.
	b.Select(t, "#split", "path")
	var before, after map[string]string
	b.Eval(t, `cudatrace.colors()`, &before)
	send(events.Event{API: events.CudaMalloc, Addr: 0x20000000, Size: 9 << 20, Device: 0, Stack: []uint64{0xa3}})
	b.Wait(t, `cudatrace.refreshes >= 2 && document.getElementById('summary').textContent.includes('peak 17.0 MiB')`, 15*time.Second)
	b.Eval(t, `cudatrace.colors()`, &after)
	for name, c := range before {
		if after[name] != c {
			t.Errorf("path %q was %s, %s after a refresh (%v, then %v)", name, c, after[name], before, after)
		}
	}
	var owners int
	b.Eval(t, `document.querySelectorAll('#owners tr').length - 1`, &owners)
	if owners < 1 {
		t.Errorf("the live page's table by owner is empty")
	}
	b.CheckClean(t, url, srv.URL+"/ui/data")
}
