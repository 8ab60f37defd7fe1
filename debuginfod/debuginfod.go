// Package debuginfod fetches separate debug files by build ID from
// debuginfod servers, the protocol elfutils defines and gdb, perf and
// the OpenTelemetry profiler speak: GET URL/buildid/ID/debuginfo from each
// server of DEBUGINFOD_URLS in turn, kept in the client cache elfutils
// lays out (DEBUGINFOD_CACHE_PATH, else $XDG_CACHE_HOME/debuginfod_client,
// else ~/.cache/debuginfod_client: ID/debuginfo), so that a file one tool
// fetched the others find. Stripped interpreters and distribution
// libraries are named from what it fetches.
//
// Nothing is fetched unless DEBUGINFOD_URLS (or the caller) names a
// server. Each fetch is bounded by a timeout; a server that cannot be
// reached is said once and left alone for a while; a build ID no server
// has is remembered as missing for a while (elfutils' negative cache:
// an empty file of mode 0); the cache is bounded in bytes, least recently
// used first out. A leaf: it imports nothing of cudatrace.
package debuginfod

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNotFound says no server has a debug file for the build ID (or every
// server that might could not be reached: the error says which).
var ErrNotFound = errors.New("no debug file for this build ID")

// Defaults, each overridable by the environment elfutils' client reads.
const (
	// DefaultTimeout bounds one fetch from one server (DEBUGINFOD_TIMEOUT,
	// seconds). elfutils waits 90 s; a tracer's naming must not.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxCache bounds the cache's debug files, in bytes.
	DefaultMaxCache = 2 << 30
	// MissFor is how long a build ID no server had is not asked for again
	// (elfutils' cache_miss_s default).
	MissFor = 10 * time.Minute
	// DownFor is how long a server that could not be reached is left alone.
	DownFor = time.Minute
	// maxFile bounds one debug file (DEBUGINFOD_MAXSIZE caps it lower).
	maxFile = 1 << 30
)

// Client fetches debug files. Safe for concurrent use; a build ID asked
// for by several callers at once is fetched once.
type Client struct {
	URLs     []string      // servers, tried in order
	Cache    string        // the cache directory (elfutils' layout)
	Timeout  time.Duration // per fetch from one server
	MaxCache int64         // bytes of debug files the cache keeps at most
	MaxFile  int64         // bytes one debug file may have at most
	// Warn is told, once per server, that it could not be reached.
	Warn func(msg string)
	HTTP *http.Client

	mu     sync.Mutex
	down   map[string]time.Time // server -> until when it is left alone
	warned map[string]bool
	calls  map[string]*call // fetches under way, by build ID
}

type call struct {
	done chan struct{}
	path string
	err  error
}

var (
	defaultOnce   sync.Once
	defaultClient *Client
)

// Default is the process's one client, from its environment (FromEnv);
// nil when DEBUGINFOD_URLS names no server.
func Default() *Client {
	defaultOnce.Do(func() {
		defaultClient = FromEnv(func(msg string) { fmt.Fprintf(os.Stderr, "cudatrace: warning: %s\n", msg) })
	})
	return defaultClient
}

// FromEnv makes a client from DEBUGINFOD_URLS (servers, separated by
// spaces), DEBUGINFOD_CACHE_PATH, DEBUGINFOD_TIMEOUT (seconds) and
// DEBUGINFOD_MAXSIZE (bytes), as elfutils' client reads them; nil when
// DEBUGINFOD_URLS names no server.
func FromEnv(warn func(string)) *Client {
	urls := strings.Fields(os.Getenv("DEBUGINFOD_URLS"))
	if len(urls) == 0 {
		return nil
	}
	c := &Client{URLs: urls, Cache: cacheDir(), Timeout: DefaultTimeout, MaxCache: DefaultMaxCache, MaxFile: maxFile, Warn: warn}
	if s, err := strconv.Atoi(os.Getenv("DEBUGINFOD_TIMEOUT")); err == nil && s > 0 {
		c.Timeout = time.Duration(s) * time.Second
	}
	if n, err := strconv.ParseInt(os.Getenv("DEBUGINFOD_MAXSIZE"), 10, 64); err == nil && n > 0 {
		c.MaxFile = n
	}
	return c
}

// cacheDir is where elfutils' client keeps what it fetched.
func cacheDir() string {
	if d := os.Getenv("DEBUGINFOD_CACHE_PATH"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "debuginfod_client")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "debuginfod_client")
	}
	return filepath.Join(os.TempDir(), "debuginfod_client")
}

// validID says whether id is a build ID (lowercase hex, as servers and the
// cache name them): nothing else becomes a path or a URL.
func validID(id string) bool {
	if len(id) < 2 || len(id) > 128 || len(id)%2 != 0 {
		return false
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// Debuginfo returns the path of the debug file with build ID id, from the
// cache or fetched now: ErrNotFound (wrapped) when no server has it, or
// none could be asked.
func (c *Client) Debuginfo(ctx context.Context, id string) (string, error) {
	id = strings.ToLower(id)
	if !validID(id) {
		return "", fmt.Errorf("build ID %q: %w", id, ErrNotFound)
	}
	path := filepath.Join(c.Cache, id, "debuginfo")
	if st, err := os.Stat(path); err == nil {
		if st.Mode().IsRegular() && st.Size() > 0 && st.Mode().Perm() != 0 {
			now := time.Now()
			_ = os.Chtimes(path, now, now) // recently used: the last to go
			return path, nil
		}
		if st.Mode().Perm() == 0 && time.Since(st.ModTime()) < MissFor {
			return "", fmt.Errorf("build ID %s (no server had it %v ago): %w", id, time.Since(st.ModTime()).Round(time.Second), ErrNotFound)
		}
	}
	c.mu.Lock()
	if cl, ok := c.calls[id]; ok {
		c.mu.Unlock()
		select {
		case <-cl.done:
			return cl.path, cl.err
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	cl := &call{done: make(chan struct{})}
	if c.calls == nil {
		c.calls = map[string]*call{}
	}
	c.calls[id] = cl
	c.mu.Unlock()
	cl.path, cl.err = c.fetch(ctx, id, path)
	c.mu.Lock()
	delete(c.calls, id)
	c.mu.Unlock()
	close(cl.done)
	return cl.path, cl.err
}

// fetch asks each server in turn for id's debug file and keeps the first
// one found at path.
func (c *Client) fetch(ctx context.Context, id, path string) (string, error) {
	var errs []error
	missing := 0
	for _, server := range c.URLs {
		if c.isDown(server) {
			errs = append(errs, fmt.Errorf("%s: not reachable a moment ago", server))
			continue
		}
		err := c.get(ctx, server, id, path)
		switch {
		case err == nil:
			c.trim(path)
			return path, nil
		case errors.Is(err, ErrNotFound):
			missing++
		default:
			c.setDown(server, err)
			errs = append(errs, err)
		}
	}
	if missing == len(c.URLs) {
		c.rememberMiss(path)
	}
	errs = append(errs, ErrNotFound)
	return "", fmt.Errorf("debug file of build ID %s: %w", id, errors.Join(errs...))
}

// get fetches id's debug file from server into path (through a temporary
// file: a reader never sees half of one).
func (c *Client) get(ctx context.Context, server, id, path string) error {
	u, err := url.Parse(strings.TrimRight(server, "/") + "/buildid/" + id + "/debuginfo")
	if err != nil || u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("debuginfod server %q: not an http(s) URL", server)
	}
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "cudatrace")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("debuginfod server %s: %w", server, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ErrNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("debuginfod server %s: %s", server, resp.Status)
	}
	limit := c.MaxFile
	if limit <= 0 {
		limit = maxFile
	}
	if resp.ContentLength > limit {
		return fmt.Errorf("debuginfod server %s: debug file of %d bytes, over the %d allowed: %w", server, resp.ContentLength, limit, ErrNotFound)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("debuginfod cache: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".debuginfo.*")
	if err != nil {
		return fmt.Errorf("debuginfod cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // gone once renamed
	n, err := io.Copy(tmp, io.LimitReader(resp.Body, limit+1))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
		return fmt.Errorf("debuginfod server %s: %w", server, err)
	case n > limit:
		return fmt.Errorf("debuginfod server %s: debug file over the %d bytes allowed: %w", server, limit, ErrNotFound)
	case n == 0:
		return ErrNotFound
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("debuginfod cache: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("debuginfod cache: %w", err)
	}
	return nil
}

// rememberMiss leaves at path what elfutils leaves for a build ID no
// server has: an empty file of mode 0, its time when.
func (c *Client) rememberMiss(path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return
	}
	os.Remove(path)
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0); err == nil {
		f.Close()
	}
}

func (c *Client) isDown(server string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Before(c.down[server])
}

// setDown leaves server alone for DownFor, and says so once.
func (c *Client) setDown(server string, err error) {
	c.mu.Lock()
	if c.down == nil {
		c.down, c.warned = map[string]time.Time{}, map[string]bool{}
	}
	c.down[server] = time.Now().Add(DownFor)
	say := !c.warned[server]
	c.warned[server] = true
	c.mu.Unlock()
	if say && c.Warn != nil {
		c.Warn(fmt.Sprintf("%v: frames of stripped files stay addresses where no local debug file names them (said once; DEBUGINFOD_URLS names the servers)", err))
	}
}

// trim keeps the cache's debug files within MaxCache bytes, the least
// recently used out first, keep (just fetched) last of all.
func (c *Client) trim(keep string) {
	if c.MaxCache <= 0 {
		return
	}
	type file struct {
		path string
		size int64
		used time.Time
	}
	var files []file
	var total int64
	ents, err := os.ReadDir(c.Cache)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !validID(e.Name()) {
			continue // not an entry of the layout: not ours to remove
		}
		p := filepath.Join(c.Cache, e.Name(), "debuginfo")
		st, err := os.Lstat(p)
		if err != nil || !st.Mode().IsRegular() {
			continue
		}
		files = append(files, file{p, st.Size(), st.ModTime()})
		total += st.Size()
	}
	if total <= c.MaxCache {
		return
	}
	sort.Slice(files, func(i, j int) bool {
		if (files[i].path == keep) != (files[j].path == keep) {
			return files[j].path == keep
		}
		return files[i].used.Before(files[j].used)
	})
	for _, f := range files {
		if total <= c.MaxCache || f.path == keep {
			break
		}
		if err := os.Remove(f.path); err == nil || errors.Is(err, fs.ErrNotExist) {
			total -= f.size
		}
	}
}
