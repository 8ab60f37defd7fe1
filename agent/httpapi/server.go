// Package httpapi is the agent's HTTP face: Prometheus metrics, a pprof
// profile of the live GPU memory, memory snapshots and trace windows. It
// only translates requests into calls on agent.Agent and writes what they
// return.
package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cudatrace/cudatrace/agent"
)

// Options tune the handler.
type Options struct {
	Version string
	// Token, when not empty, is the bearer token every request must carry
	// (Authorization: Bearer TOKEN). Without one, only root and the
	// agent's own user may read the agent, over loopback (peer.go), unless
	// Open.
	Token string
	// Open serves every client that reaches the listener, without a
	// token (--insecure-no-token).
	Open bool
	// ProcessLabels puts pid, comm, container_id, pod_uid, namespace, pod and container on the metrics;
	// off, the metrics are summed per device (fewer series).
	ProcessLabels bool
	// MaxTraceWindow bounds /trace?seconds=.
	MaxTraceWindow time.Duration
	// MaxTraceWindows bounds the /trace windows open at once (429 past
	// it); 0: DefaultMaxTraceWindows.
	MaxTraceWindows int
}

// DefaultMaxTraceWindow is the longest /trace window by default.
const DefaultMaxTraceWindow = 10 * time.Minute

// defaultTraceWindow is /trace's window without ?seconds=.
const defaultTraceWindow = 10 * time.Second

// New returns the agent's HTTP handler.
func New(a *agent.Agent, opts Options) http.Handler {
	if opts.MaxTraceWindow <= 0 {
		opts.MaxTraceWindow = DefaultMaxTraceWindow
	}
	if opts.MaxTraceWindows <= 0 {
		opts.MaxTraceWindows = DefaultMaxTraceWindows
	}
	reg := prometheus.NewRegistry()
	// The agent's own memory and CPU, as every Go exporter shows them: a
	// daemon that must stay bounded is watched by its RSS.
	reg.MustRegister(newCollector(a, opts.Version, opts.ProcessLabels),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &server{a: a, opts: opts,
		windows: newLimiter("trace windows", opts.MaxTraceWindows, 0, 0),
		heavy:   newLimiter("profiles and snapshots", DefaultMaxHeavy, DefaultMaxWaiting, heavyWait)}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{MaxRequestsInFlight: metricsInFlight}))
	mux.HandleFunc("GET /debug/pprof/cuda_memory", s.profile)
	mux.HandleFunc("GET /snapshot", s.snapshot)
	mux.HandleFunc("GET /trace", s.trace)
	mux.HandleFunc("GET /ui", s.ui(false))
	mux.HandleFunc("GET /ui/data", s.ui(true))
	mux.HandleFunc("GET /{$}", s.index)
	if opts.Open && opts.Token == "" {
		return mux
	}
	return s.auth(mux)
}

type server struct {
	a    *agent.Agent
	opts Options
	// windows: /trace streams open; heavy: profiles and snapshots being
	// copied and built (limits.go).
	windows, heavy *limiter
}

// auth lets a request through with the token, or, without a token
// configured, from root or the agent's own user over loopback.
func (s *server) auth(next http.Handler) http.Handler {
	want := []byte(s.opts.Token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(want) == 0 {
			if !trustedPeer(r.Context()) {
				http.Error(w, "cudatrace agent: only root and the agent's own user may read it, over loopback; "+
					"other clients need the agent to have a --token-file (docs/agent.md, Access)", http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if subtle.ConstantTimeCompare(bearer(r), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="cudatrace"`)
			http.Error(w, "cudatrace agent: a bearer token is required (Authorization: Bearer TOKEN)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearer is the request's bearer token: the auth scheme is
// case-insensitive (RFC 9110, 11.1).
func bearer(r *http.Request) []byte {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	return []byte(strings.TrimSpace(tok))
}

const indexText = `cudatrace agent %s

/metrics                          Prometheus metrics
/debug/pprof/cuda_memory[?pid=N]  pprof heap profile of GPU memory: inuse_* live now, alloc_* since the last scrape
/snapshot?pid=N                   PyTorch memory snapshot (pytorch.org/memory_viz) of one process
/trace?pid=N&seconds=S            a trace file of the next S seconds (cudatrace report / export read it)
/ui[?pid=N]                       the memory page, to open in a browser: memory over time, flame graphs, leaks; it refreshes
`

func (s *server) index(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, indexText, s.opts.Version)
}

// pidParam reads ?pid=; 0 when absent and not required.
func pidParam(r *http.Request, required bool) (uint32, error) {
	v := r.URL.Query().Get("pid")
	if v == "" {
		if required {
			return 0, errors.New("?pid= is required: a snapshot is one process's (see /metrics for the PIDs)")
		}
		return 0, nil
	}
	pid, err := strconv.ParseUint(v, 10, 32)
	if err != nil || pid == 0 {
		return 0, fmt.Errorf("?pid=%q: want a process ID", v)
	}
	return uint32(pid), nil
}

// fail answers an error with the status it calls for.
func fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, agent.ErrNoProcess):
		code = http.StatusNotFound
	case errors.Is(err, agent.ErrStopped):
		code = http.StatusServiceUnavailable
	}
	http.Error(w, "cudatrace agent: "+err.Error(), code)
}

// profile and snapshot are built in memory before the first byte goes
// out, so an error still gets its status code.
func (s *server) profile(w http.ResponseWriter, r *http.Request) {
	s.built(w, r, false, s.a.Profile, func(uint32) string { return "cuda_memory.pb.gz" })
}

func (s *server) snapshot(w http.ResponseWriter, r *http.Request) {
	s.built(w, r, true, s.a.Snapshot, func(pid uint32) string { return fmt.Sprintf("snapshot-%d.pickle", pid) })
}

// built serves what build writes for the request's ?pid= (required or
// not), as an attachment named by name, taking one of the heavy requests'
// slots while it builds.
func (s *server) built(w http.ResponseWriter, r *http.Request, needPID bool,
	build func(context.Context, io.Writer, uint32) error, name func(pid uint32) string) {
	s.serveBuilt(w, r, needPID, build, func(h http.Header, pid uint32) {
		h.Set("Content-Type", "application/octet-stream")
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename=%q`, name(pid)))
	})
}

// serveBuilt serves what build writes for the request's ?pid= (required
// or not), built in memory in one of the heavy requests' slots, so that
// an error still gets its status; header sets the answer's headers.
func (s *server) serveBuilt(w http.ResponseWriter, r *http.Request, needPID bool,
	build func(context.Context, io.Writer, uint32) error, header func(http.Header, uint32)) {
	pid, err := pidParam(r, needPID)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !s.heavy.acquire(w, r) {
		return
	}
	defer s.heavy.release()
	var buf bytes.Buffer
	if err := build(r.Context(), &buf, pid); err != nil {
		fail(w, err)
		return
	}
	header(w.Header(), pid)
	w.Write(buf.Bytes())
}

func (s *server) trace(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r, false)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	d := defaultTraceWindow
	if v := r.URL.Query().Get("seconds"); v != "" {
		sec, err := strconv.ParseFloat(v, 64)
		// !(sec > 0) refuses NaN too; +Inf is over any maximum.
		if err != nil || !(sec > 0) || sec > s.opts.MaxTraceWindow.Seconds() {
			http.Error(w, fmt.Sprintf("?seconds=%q: want a number of seconds up to %v", v,
				s.opts.MaxTraceWindow.Seconds()), http.StatusBadRequest)
			return
		}
		d = time.Duration(sec * float64(time.Second))
	}
	if !s.windows.acquire(w, r) {
		return
	}
	defer s.windows.release()
	// The trace streams: the status goes out with the first bytes, so an
	// unknown PID is checked first.
	if pid != 0 {
		if err := s.a.Known(r.Context(), pid); err != nil {
			fail(w, err)
			return
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	name := "agent.trace"
	if pid != 0 {
		name = fmt.Sprintf("pid-%d.trace", pid)
	}
	w.Header().Set("Content-Disposition", `attachment; filename="`+strings.ReplaceAll(name, `"`, "")+`"`)
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(d + time.Minute))
	if err := s.a.Trace(r.Context(), &flushWriter{w: w, rc: rc}, pid, d); err != nil {
		// Too late for a status: the client sees a trace cut short, which
		// `cudatrace report` says is truncated.
		return
	}
}

// flushWriter pushes every write to the client: a trace window streams.
type flushWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (f *flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		f.rc.Flush()
	}
	return n, err
}
