package otlp

import (
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// profiles makes a request of n samples (and a few KiB: pad).
func profiles(n int, pad int) pprofile.Profiles {
	pd := pprofile.NewProfiles()
	d := pd.Dictionary()
	d.StringTable().Append("", "inuse_space", "bytes", string(make([]byte, pad)))
	d.StackTable().AppendEmpty()
	p := pd.ResourceProfiles().AppendEmpty().ScopeProfiles().AppendEmpty().Profiles().AppendEmpty()
	p.SampleType().SetTypeStrindex(1)
	p.SampleType().SetUnitStrindex(2)
	for range n {
		p.Samples().AppendEmpty().Values().Append(4096)
	}
	return pd
}

type grpcSink struct {
	pprofileotlp.UnimplementedGRPCServer
	mu      sync.Mutex
	samples int
	headers metadata.MD
}

func (s *grpcSink) Export(ctx context.Context, r pprofileotlp.ExportRequest) (pprofileotlp.ExportResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples += r.Profiles().SampleCount()
	s.headers, _ = metadata.FromIncomingContext(ctx)
	return pprofileotlp.NewExportResponse(), nil
}

func TestGRPC(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	sink := &grpcSink{}
	pprofileotlp.RegisterGRPCServer(srv, sink)
	go srv.Serve(ln)
	defer srv.Stop()

	e, err := New(Options{Endpoint: ln.Addr().String(), Insecure: true, Headers: map[string]string{"authorization": "Bearer t0k"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Enqueue(profiles(3, 0)); err != nil {
		t.Fatal(err)
	}
	if err := e.Export(context.Background(), profiles(2, 0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.Close(ctx)
	st := e.Stats()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.samples != 5 || st.Sent != 2 || st.SentSamples != 5 || st.Dropped != 0 {
		t.Fatalf("the receiver got %d samples; stats %+v", sink.samples, st)
	}
	if got := sink.headers.Get("authorization"); len(got) != 1 || got[0] != "Bearer t0k" {
		t.Errorf("authorization header: %q", got)
	}
	if got := sink.headers.Get(pprofileotlp.DevelopmentVersionHeader); len(got) != 1 {
		t.Errorf("no %s header", pprofileotlp.DevelopmentVersionHeader)
	}
}

// A receiver that is down: the queue stays within its bytes, what does
// not fit is dropped and counted, and once the receiver is back what is
// queued goes.
func TestHTTPDownBoundedThenRecovers(t *testing.T) {
	var up atomic.Bool
	var got atomic.Int64
	var auth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path != HTTPPath || r.Header.Get("Content-Encoding") != "gzip" {
			t.Errorf("request to %s, encoding %q", r.URL.Path, r.Header.Get("Content-Encoding"))
		}
		auth.Store(r.Header.Get("Authorization"))
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		b, _ := io.ReadAll(zr)
		req := pprofileotlp.NewExportRequest()
		if err := req.UnmarshalProto(b); err != nil {
			t.Error(err)
			return
		}
		got.Add(int64(req.Profiles().SampleCount()))
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ = pprofileotlp.NewExportResponse().MarshalProto()
		w.Write(b)
	}))
	defer srv.Close()

	const queue = 64 << 10
	e, err := New(Options{Endpoint: srv.URL, Protocol: HTTP, QueueBytes: queue, MaxElapsed: time.Hour,
		Headers: map[string]string{"Authorization": "Bearer x"}})
	if err != nil {
		t.Fatal(err)
	}
	const pushes = 40
	for range pushes {
		if err := e.Enqueue(profiles(10, 8<<10)); err != nil { // ~8 KiB each
			t.Fatal(err)
		}
		if q := e.Stats().QueueBytes; q > queue+16<<10 {
			t.Fatalf("queue holds %d bytes, more than its %d", q, queue)
		}
	}
	for e.Stats().Failures == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	st := e.Stats()
	if st.Dropped == 0 || st.Sent != 0 {
		t.Fatalf("with the receiver down: %+v", st)
	}
	up.Store(true)
	deadline := time.Now().Add(30 * time.Second)
	for e.Stats().Queued > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	e.Close(context.Background())
	st = e.Stats()
	if st.Sent+st.Dropped != pushes || int64(st.SentSamples) != got.Load() || st.SentSamples+st.DroppedSamples != pushes*10 {
		t.Fatalf("after the receiver came back: %+v, received %d samples", st, got.Load())
	}
	if auth.Load() != "Bearer x" {
		t.Errorf("Authorization %v", auth.Load())
	}
}

// A request the receiver refuses (400) is not retried: dropped at once.
func TestRefusedNotRetried(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "bad", http.StatusBadRequest)
	}))
	defer srv.Close()
	e, err := New(Options{Endpoint: srv.URL, Protocol: HTTP})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	if err := e.Export(context.Background(), profiles(1, 0)); err == nil {
		t.Fatal("a refused request succeeded")
	}
	if calls.Load() != 1 || e.Stats().Dropped != 1 {
		t.Fatalf("%d calls, stats %+v", calls.Load(), e.Stats())
	}
}
