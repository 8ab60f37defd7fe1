// Package otlp sends OpenTelemetry profiles (OTLP's profiles signal) to a
// Collector, over gRPC or HTTP, as OpenTelemetry's own exporters do: TLS
// (a CA, a client certificate) or plaintext, headers (a token), gzip,
// retries with exponential backoff on what OTLP says to retry, and a
// bounded queue in front of the sender. Enqueue never waits: a Collector
// that is down or slow costs the oldest queued requests (counted in Stats),
// never the caller's time, and never more memory than the queue's bytes.
//
// A leaf: it knows pdata's pprofile and nothing of cudatrace. The profiles
// it sends are built by package export (export/otlp.go).
package otlp

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/encoding/gzip" // registers the gzip compressor
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Protocols.
const (
	GRPC = "grpc"
	HTTP = "http/protobuf"
)

// Defaults.
const (
	DefaultTimeout    = 10 * time.Second
	DefaultQueueBytes = 32 << 20
	DefaultMaxElapsed = 2 * time.Minute
	// HTTPPath is where a Collector's OTLP/HTTP receiver takes profiles.
	HTTPPath = "/v1development/profiles"
	// grpcMethod is the profiles service's Export.
	grpcMethod = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
	// backoff: the first retry's wait, and the longest.
	firstBackoff = 500 * time.Millisecond
	maxBackoff   = 15 * time.Second
)

// Options say where and how to send.
type Options struct {
	// Endpoint: for gRPC host:port (or http://, https:// before it, which
	// choose plaintext or TLS); for HTTP a URL, HTTPPath added when it has
	// no path.
	Endpoint string
	Protocol string // GRPC (default) or HTTP
	// Insecure sends in plaintext (gRPC); an http:// URL does the same.
	Insecure bool
	// TLS: CAFile verifies the Collector (default: the system's roots);
	// CertFile and KeyFile are the client's certificate, for mTLS.
	CAFile, CertFile, KeyFile string
	ServerName                string // the name the Collector's certificate is checked against; "" from Endpoint
	// Headers go with every request (gRPC metadata; HTTP headers):
	// "Authorization: Bearer ..." for a token.
	Headers map[string]string
	// Timeout bounds one request; 0 means DefaultTimeout.
	Timeout time.Duration
	// QueueBytes bounds what waits to be sent (encoded requests); past it
	// the oldest are dropped. 0 means DefaultQueueBytes.
	QueueBytes int64
	// MaxElapsed bounds the retries of one request; 0 means
	// DefaultMaxElapsed.
	MaxElapsed time.Duration
	// Stderr gets one line per change between sending and failing.
	Stderr io.Writer
}

// Stats count what happened to the requests given to an Exporter.
type Stats struct {
	Sent, SentSamples       uint64 // requests the Collector took, and their samples
	Dropped, DroppedSamples uint64 // requests given up on: queue full, retries spent, or refused
	Rejected                uint64 // samples the Collector said it rejected (partial success)
	Retries                 uint64 // requests sent again
	Failures                uint64 // failed attempts
	QueueBytes              int64  // encoded requests waiting now, and the one being sent
	Queued                  int    // requests waiting now
}

// item is one encoded request.
type item struct {
	body    []byte
	samples int
}

// Exporter sends what Enqueue gives it, in order, from its own goroutine.
type Exporter struct {
	opts   Options
	send   func(ctx context.Context, body []byte) (rejected int64, err error)
	conn   *grpc.ClientConn
	client *http.Client
	url    string

	mu     sync.Mutex
	queue  []item
	qbytes int64 // of the queue
	// inflight is the request being sent (taken off the queue): with the
	// queue, at most QueueBytes, or one request past it when the queue is
	// empty.
	inflight int64
	wake     chan struct{}
	closing  chan struct{}
	done     chan struct{}
	failing  bool // the loop's: the last attempt failed

	sent, sentSamples, dropped, droppedSamples, rejected, retries, failures atomic.Uint64
}

// New returns an Exporter (nothing is connected until the first send).
func New(opts Options) (*Exporter, error) {
	if opts.Endpoint == "" {
		return nil, errors.New("otlp: no endpoint")
	}
	if opts.Protocol == "" {
		opts.Protocol = GRPC
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.QueueBytes <= 0 {
		opts.QueueBytes = DefaultQueueBytes
	}
	if opts.MaxElapsed <= 0 {
		opts.MaxElapsed = DefaultMaxElapsed
	}
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	e := &Exporter{opts: opts, wake: make(chan struct{}, 1), closing: make(chan struct{}), done: make(chan struct{})}
	var err error
	switch opts.Protocol {
	case GRPC:
		err = e.dialGRPC()
	case HTTP:
		err = e.setupHTTP()
	default:
		err = fmt.Errorf("otlp: protocol %q: want %s or %s", opts.Protocol, GRPC, HTTP)
	}
	if err != nil {
		return nil, err
	}
	go e.loop()
	return e, nil
}

func (e *Exporter) tlsConfig(host string) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.opts.ServerName}
	if c.ServerName == "" {
		c.ServerName = host
	}
	if e.opts.CAFile != "" {
		pem, err := os.ReadFile(e.opts.CAFile)
		if err != nil {
			return nil, fmt.Errorf("otlp: CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("otlp: CA %s: no certificate in it", e.opts.CAFile)
		}
		c.RootCAs = pool
	}
	if e.opts.CertFile != "" || e.opts.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(e.opts.CertFile, e.opts.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("otlp: client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

func (e *Exporter) dialGRPC() error {
	target, plain := e.opts.Endpoint, e.opts.Insecure
	switch {
	case strings.HasPrefix(target, "http://"):
		target, plain = strings.TrimPrefix(target, "http://"), true
	case strings.HasPrefix(target, "https://"):
		target, plain = strings.TrimPrefix(target, "https://"), false
	}
	target = strings.TrimSuffix(target, "/")
	creds := insecure.NewCredentials()
	if !plain {
		host := target
		if i := strings.LastIndex(host, ":"); i >= 0 {
			host = host[:i]
		}
		tc, err := e.tlsConfig(host)
		if err != nil {
			return err
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("otlp: %w", err)
	}
	e.conn = conn
	e.send = e.sendGRPC
	return nil
}

func (e *Exporter) setupHTTP() error {
	raw := e.opts.Endpoint
	if !strings.Contains(raw, "://") {
		raw = "https://" + raw
		if e.opts.Insecure {
			raw = "http://" + e.opts.Endpoint
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("otlp: endpoint: %w", err)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = HTTPPath
	}
	tr := &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConns: 2, IdleConnTimeout: time.Minute}
	if u.Scheme == "https" {
		tc, err := e.tlsConfig(u.Hostname())
		if err != nil {
			return err
		}
		tr.TLSClientConfig = tc
	}
	e.client = &http.Client{Transport: tr, Timeout: e.opts.Timeout}
	e.url = u.String()
	e.send = e.sendHTTP
	return nil
}

// rawCodec passes an encoded request through gRPC as it is.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*(v.(*[]byte)) = data.Materialize()
	return nil
}

func (e *Exporter) sendGRPC(ctx context.Context, body []byte) (int64, error) {
	md := metadata.New(e.opts.Headers)
	md.Set(pprofileotlp.DevelopmentVersionHeader, pprofileotlp.DevelopmentVersion)
	ctx = metadata.NewOutgoingContext(ctx, md)
	var resp []byte
	err := e.conn.Invoke(ctx, grpcMethod, body, &resp, grpc.ForceCodecV2(rawCodec{}), grpc.UseCompressor("gzip"))
	if err != nil {
		return 0, err
	}
	return rejectedOf(resp), nil
}

// httpError is an HTTP answer other than 200.
type httpError struct {
	code       int
	retryAfter time.Duration
	msg        string
}

func (h *httpError) Error() string { return fmt.Sprintf("HTTP %d: %s", h.code, h.msg) }

func (e *Exporter) sendHTTP(ctx context.Context, body []byte) (int64, error) {
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	zw.Write(body)
	zw.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, &zb)
	if err != nil {
		return 0, err
	}
	for k, v := range e.opts.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "gzip")
	req.Header.Set(pprofileotlp.DevelopmentVersionHeader, pprofileotlp.DevelopmentVersion)
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		he := &httpError{code: resp.StatusCode, msg: strings.TrimSpace(string(b[:min(len(b), 200)]))}
		if s, err := time.ParseDuration(resp.Header.Get("Retry-After") + "s"); err == nil {
			he.retryAfter = s
		}
		return 0, he
	}
	return rejectedOf(b), nil
}

// rejectedOf reads a response's partial success.
func rejectedOf(resp []byte) int64 {
	r := pprofileotlp.NewExportResponse()
	if len(resp) == 0 || r.UnmarshalProto(resp) != nil {
		return 0
	}
	return r.PartialSuccess().RejectedProfiles()
}

// retryable says whether OTLP's rules ask to send err's request again.
func retryable(err error) (bool, time.Duration) {
	var he *httpError
	if errors.As(err, &he) {
		switch he.code {
		case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true, he.retryAfter
		}
		return false, 0
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.OutOfRange, codes.Unavailable,
			codes.DataLoss, codes.ResourceExhausted:
			return true, 0
		case codes.Unknown: // not a gRPC status: the transport's own error
			return true, 0
		}
		return false, 0
	}
	return true, 0 // a transport error (connection refused, reset, timeout)
}

// encode makes a request of p.
func encode(p pprofile.Profiles) (item, error) {
	b, err := pprofileotlp.NewExportRequestFromProfiles(p).MarshalProto()
	if err != nil {
		return item{}, fmt.Errorf("otlp: encode: %w", err)
	}
	return item{body: b, samples: p.SampleCount()}, nil
}

// Enqueue queues p to be sent, dropping the oldest requests queued when it
// would not fit. It never waits. p is encoded now: the caller may reuse it.
func (e *Exporter) Enqueue(p pprofile.Profiles) error {
	it, err := encode(p)
	if err != nil {
		return err
	}
	e.mu.Lock()
	if int64(len(it.body)) > e.opts.QueueBytes {
		e.mu.Unlock()
		e.drop(it)
		return fmt.Errorf("otlp: a request of %d bytes is larger than the queue (%d bytes)", len(it.body), e.opts.QueueBytes)
	}
	for e.inflight+e.qbytes+int64(len(it.body)) > e.opts.QueueBytes && len(e.queue) > 0 {
		old := e.queue[0]
		e.queue[0] = item{}
		e.queue = e.queue[1:]
		e.qbytes -= int64(len(old.body))
		e.drop(old)
	}
	e.queue = append(e.queue, it)
	e.qbytes += int64(len(it.body))
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return nil
}

func (e *Exporter) drop(it item) {
	e.dropped.Add(1)
	e.droppedSamples.Add(uint64(it.samples))
}

// Export sends p now, with the retries, and waits (the CLI's one-shot
// export); it does not go through the queue.
func (e *Exporter) Export(ctx context.Context, p pprofile.Profiles) error {
	it, err := encode(p)
	if err != nil {
		return err
	}
	return e.deliver(ctx, it)
}

func (e *Exporter) loop() {
	defer close(e.done)
	for {
		e.mu.Lock()
		var it item
		ok := len(e.queue) > 0
		if ok {
			it = e.queue[0]
			e.queue[0] = item{}
			e.queue = e.queue[1:]
			e.qbytes -= int64(len(it.body))
			e.inflight = int64(len(it.body))
		}
		e.mu.Unlock()
		if !ok {
			select {
			case <-e.wake:
				continue
			case <-e.closing:
				return
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-e.closing:
				cancel()
			case <-ctx.Done():
			}
		}()
		e.deliver(ctx, it)
		cancel()
		e.mu.Lock()
		e.inflight = 0
		e.mu.Unlock()
	}
}

// deliver sends it until it is taken, refused, or MaxElapsed has passed,
// counting what happened.
func (e *Exporter) deliver(ctx context.Context, it item) error {
	start := time.Now()
	wait := firstBackoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			e.retries.Add(1)
		}
		actx, cancel := context.WithTimeout(ctx, e.opts.Timeout)
		rej, err := e.send(actx, it.body)
		cancel()
		if err == nil {
			e.sent.Add(1)
			e.sentSamples.Add(uint64(it.samples))
			e.rejected.Add(uint64(max(rej, 0)))
			e.state(nil)
			return nil
		}
		e.failures.Add(1)
		e.state(err)
		again, after := retryable(err)
		if !again || ctx.Err() != nil || time.Since(start)+wait > e.opts.MaxElapsed {
			e.drop(it)
			return fmt.Errorf("otlp: %s: %w", e.opts.Endpoint, err)
		}
		d := max(after, wait/2+rand.N(wait/2+1))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			e.drop(it)
			return ctx.Err()
		}
		wait = min(2*wait, maxBackoff)
	}
}

// state says once when sending starts failing, and once when it works again.
func (e *Exporter) state(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case err != nil && !e.failing:
		e.failing = true
		fmt.Fprintf(e.opts.Stderr, "cudatrace: warning: OTLP export to %s: %v (retrying; what does not fit the queue is dropped and counted)\n", e.opts.Endpoint, err)
	case err == nil && e.failing:
		e.failing = false
		fmt.Fprintf(e.opts.Stderr, "cudatrace: OTLP export to %s: sending again\n", e.opts.Endpoint)
	}
}

// Stats returns the counters.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	qb, ql := e.qbytes+e.inflight, len(e.queue)
	e.mu.Unlock()
	return Stats{Sent: e.sent.Load(), SentSamples: e.sentSamples.Load(), Dropped: e.dropped.Load(),
		DroppedSamples: e.droppedSamples.Load(), Rejected: e.rejected.Load(), Retries: e.retries.Load(),
		Failures: e.failures.Load(), QueueBytes: qb, Queued: ql}
}

// Close sends what is queued until ctx ends, then stops; what is left is
// dropped and counted.
func (e *Exporter) Close(ctx context.Context) {
	for {
		e.mu.Lock()
		n := len(e.queue)
		if e.inflight > 0 {
			n++
		}
		e.mu.Unlock()
		if n == 0 || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	close(e.closing)
	<-e.done
	e.mu.Lock()
	for _, it := range e.queue {
		e.drop(it)
	}
	e.queue, e.qbytes = nil, 0
	e.mu.Unlock()
	if e.conn != nil {
		e.conn.Close()
	}
	if e.client != nil {
		e.client.CloseIdleConnections()
	}
}
