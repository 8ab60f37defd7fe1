package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// ?seconds= that is not a positive number up to the maximum gets 400, NaN
// and infinities included.
func TestTraceSecondsRefused(t *testing.T) {
	srv := serve(t, Options{})
	client := &http.Client{Timeout: 5 * time.Second}
	for _, v := range []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "infinity", "0", "-1", "1e300", "601", "x"} {
		resp, err := client.Get(srv.URL + "/trace?seconds=" + v)
		if err != nil {
			t.Errorf("?seconds=%s: %v, want 400", v, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "want a number of seconds") {
			t.Errorf("?seconds=%s: %d %.100q, want 400", v, resp.StatusCode, body)
		}
	}
}

// The windows open at once are capped: past the cap, 429 at once, and a
// window ending frees its slot.
func TestTraceWindowsCapped(t *testing.T) {
	srv := serve(t, Options{MaxTraceWindows: 3})
	var open []*http.Response
	for range 3 {
		resp, err := http.Get(srv.URL + "/trace?seconds=30")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("window: %s", resp.Status)
		}
		open = append(open, resp)
	}
	start := time.Now()
	code, body := fetch(t, srv.URL+"/trace?seconds=30")
	if code != http.StatusTooManyRequests || !strings.Contains(body, "3 trace windows") || time.Since(start) > 5*time.Second {
		t.Errorf("a 4th window: %d %q after %v, want 429 at once", code, body, time.Since(start))
	}
	open[0].Body.Close() // its handler ends with the client's connection
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(srv.URL + "/trace?seconds=0.1")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after a window's client left, a new window still gets %s", resp.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range open[1:] {
		r.Body.Close()
	}
}

// Heavy requests past the slots wait in a bounded line; past it, 429.
func TestLimiterLine(t *testing.T) {
	l := newLimiter("profiles", 1, 1, time.Minute)
	req := httptest.NewRequest("GET", "/", nil)
	if !l.acquire(httptest.NewRecorder(), req) {
		t.Fatal("first: refused")
	}
	var wg sync.WaitGroup
	got := make(chan bool, 1)
	wg.Add(1)
	go func() { defer wg.Done(); got <- l.acquire(httptest.NewRecorder(), req) }()
	for l.waiting.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	rec := httptest.NewRecorder()
	if l.acquire(rec, req) || rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Errorf("third, with the line full: %d, want 429 with Retry-After", rec.Code)
	}
	l.release()
	wg.Wait()
	if !<-got {
		t.Errorf("the waiter did not get the slot released")
	}
	l.release()
}
