package debuginfod

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const id = "c561f3aa7232f2bd6ac6d56bd475f1c154a00486"

// server serves files by build ID as /buildid/ID/debuginfo, counting the
// requests it gets.
func server(t *testing.T, files map[string]string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		rest, ok := strings.CutPrefix(r.URL.Path, "/buildid/")
		bid, kind, _ := strings.Cut(rest, "/")
		body, found := files[bid]
		if !ok || kind != "debuginfo" || !found {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	t.Cleanup(s.Close)
	return s, &n
}

func client(t *testing.T, urls ...string) (*Client, *[]string) {
	var warned []string
	return &Client{URLs: urls, Cache: t.TempDir(), Timeout: 2 * time.Second, MaxCache: DefaultMaxCache,
		Warn: func(m string) { warned = append(warned, m) }}, &warned
}

// A debug file is fetched from the first server that has it, kept where
// elfutils' client keeps it (ID/debuginfo), and found there next time
// without asking again.
func TestFetchAndCache(t *testing.T) {
	empty, emptyN := server(t, nil)
	full, fullN := server(t, map[string]string{id: "DEBUG"})
	c, warned := client(t, empty.URL, full.URL+"/")
	for range 2 {
		path, err := c.Debuginfo(context.Background(), strings.ToUpper(id))
		if err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(c.Cache, id, "debuginfo"); path != want {
			t.Errorf("path %s, want %s", path, want)
		}
		if b, _ := os.ReadFile(path); string(b) != "DEBUG" {
			t.Errorf("cached %q", b)
		}
	}
	if emptyN.Load() != 1 || fullN.Load() != 1 {
		t.Errorf("requests: %d to the empty server, %d to the full one; want 1 and 1", emptyN.Load(), fullN.Load())
	}
	if len(*warned) != 0 {
		t.Errorf("warned %q", *warned)
	}
}

// A build ID no server has is remembered as missing (an empty file of
// mode 0, as elfutils does) and not asked for again for a while; nothing
// but a build ID becomes a path or a URL.
func TestMissRemembered(t *testing.T) {
	s, n := server(t, nil)
	c, _ := client(t, s.URL)
	for range 3 {
		if _, err := c.Debuginfo(context.Background(), id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("err %v, want ErrNotFound", err)
		}
	}
	if n.Load() != 1 {
		t.Errorf("%d requests for a missing build ID, want 1", n.Load())
	}
	st, err := os.Stat(filepath.Join(c.Cache, id, "debuginfo"))
	if err != nil || st.Size() != 0 || st.Mode().Perm() != 0 {
		t.Errorf("negative cache entry: %v %v", st, err)
	}
	for _, bad := range []string{"../../etc/passwd", "abc", "zz", ""} {
		if _, err := c.Debuginfo(context.Background(), bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("build ID %q: %v, want ErrNotFound", bad, err)
		}
	}
	if n.Load() != 1 {
		t.Errorf("requests for invalid build IDs: %d", n.Load()-1)
	}
}

// A server that cannot be reached costs one line, once, and is left alone
// for a while: the next lookups do not wait for it again.
func TestServerDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, warned := client(t, "http://"+addr)
	for range 3 {
		start := time.Now()
		if _, err := c.Debuginfo(context.Background(), id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("err %v, want ErrNotFound", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("a lookup took %v", d)
		}
	}
	if len(*warned) != 1 || !strings.Contains((*warned)[0], addr) {
		t.Errorf("warned %q, want one line naming %s", *warned, addr)
	}
	if _, err := os.Stat(filepath.Join(c.Cache, id, "debuginfo")); err == nil {
		t.Error("a build ID remembered as missing while its server was down")
	}
}

// A server that answers too slowly is given up on at the timeout.
func TestTimeout(t *testing.T) {
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer s.Close()
	defer close(release)
	c, warned := client(t, s.URL)
	c.Timeout = 200 * time.Millisecond
	start := time.Now()
	if _, err := c.Debuginfo(context.Background(), id); !errors.Is(err, ErrNotFound) {
		t.Fatalf("err %v, want ErrNotFound", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v with a 200ms timeout", d)
	}
	if len(*warned) != 1 {
		t.Errorf("warned %q", *warned)
	}
}

// The cache keeps at most MaxCache bytes of debug files, the least
// recently used going first, the one just fetched kept.
func TestCacheBounded(t *testing.T) {
	ids := []string{"aa01", "aa02", "aa03"}
	files := map[string]string{}
	for _, i := range ids {
		files[i] = strings.Repeat("x", 100)
	}
	s, _ := server(t, files)
	c, _ := client(t, s.URL)
	c.MaxCache = 250
	for k, i := range ids {
		if _, err := c.Debuginfo(context.Background(), i); err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(time.Duration(k-10) * time.Minute)
		os.Chtimes(filepath.Join(c.Cache, i, "debuginfo"), old, old)
	}
	var kept []string
	for _, i := range ids {
		if _, err := os.Stat(filepath.Join(c.Cache, i, "debuginfo")); err == nil {
			kept = append(kept, i)
		}
	}
	if strings.Join(kept, " ") != "aa02 aa03" {
		t.Errorf("kept %v, want the two most recent", kept)
	}
}

// FromEnv reads elfutils' variables; no server named, no client.
func TestFromEnv(t *testing.T) {
	t.Setenv("DEBUGINFOD_URLS", "")
	if c := FromEnv(nil); c != nil {
		t.Errorf("a client without DEBUGINFOD_URLS: %+v", c)
	}
	t.Setenv("DEBUGINFOD_URLS", "http://a:8002  https://b/")
	t.Setenv("DEBUGINFOD_CACHE_PATH", "/x/cache")
	t.Setenv("DEBUGINFOD_TIMEOUT", "3")
	c := FromEnv(nil)
	if c == nil || strings.Join(c.URLs, ",") != "http://a:8002,https://b/" || c.Cache != "/x/cache" || c.Timeout != 3*time.Second {
		t.Errorf("client %+v", c)
	}
}
