package record

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/tracefile"
)

// nvmlSession is a session writing to a buffer, with a sampler over open.
func nvmlSession(t *testing.T, open func() (gpustat.Source, error)) (*session, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	var trace, stderr bytes.Buffer
	w, err := NewTraceWriter(&trace, tracefile.Meta{Tool: "test"})
	if err != nil {
		t.Fatal(err)
	}
	s := &session{opts: Options{Stderr: &stderr}, res: &Result{Ledger: ledger.New()}, w: w,
		warned: map[string]bool{}}
	s.sampler = startSampler(open, 5*time.Millisecond)
	t.Cleanup(s.sampler.close)
	return s, &trace, &stderr
}

// nvmlFrames reads the nvml frames back from a trace.
func nvmlFrames(t *testing.T, s *session, trace *bytes.Buffer) []*tracefile.NVML {
	t.Helper()
	if err := s.w.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := tracefile.NewReader(bytes.NewReader(trace.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var out []*tracefile.NVML
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.NVML != nil {
			out = append(out, rec.NVML)
		}
	}
}

func TestNVMLSamples(t *testing.T) {
	fake := &gpustat.Fake{
		Devs:  []gpustat.Device{{Index: 0, UUID: "GPU-a", Name: "Fake", Total: 1000, Used: 600, Free: 400}},
		Procs: []gpustat.ProcessUsage{{PID: 42, Device: 0, UUID: "GPU-a", Used: 512}},
	}
	s, trace, stderr := nvmlSession(t, func() (gpustat.Source, error) { return fake, nil })
	deadline := time.Now().Add(10 * time.Second)
	for s.res.NVML == nil && time.Now().Before(deadline) {
		s.takeNVML()
		time.Sleep(time.Millisecond)
	}
	if s.res.NVML == nil {
		t.Fatal("no sample in 10 s")
	}
	if used, ok := s.res.NVML.Used(42); used != 512 || !ok || s.res.NVMLTime == 0 {
		t.Errorf("result: pid 42 used %d (%v) at %d", used, ok, s.res.NVMLTime)
	}
	frames := nvmlFrames(t, s, trace)
	if len(frames) != 1 {
		t.Fatalf("%d nvml frames, want 1", len(frames))
	}
	want := &tracefile.NVML{Time: s.res.NVMLTime,
		Devices:   []tracefile.NVMLDevice{{Index: 0, UUID: "GPU-a", Name: "Fake", Total: 1000, Used: 600, Free: 400}},
		Processes: []tracefile.NVMLProcess{{PID: 42, Device: 0, UUID: "GPU-a", Used: 512}}}
	if !reflect.DeepEqual(frames[0], want) {
		t.Errorf("frame\n got %+v\nwant %+v", frames[0], want)
	}
	s.sampler.close()
	if !fake.Closed {
		t.Error("the sampler did not close its source")
	}
	if stderr.Len() != 0 {
		t.Errorf("stderr %q", stderr)
	}
}

// Without NVML: one line says why, one frame records it, and nothing else.
func TestNVMLUnavailable(t *testing.T) {
	why := errors.New("NVML unavailable: Driver Not Loaded")
	s, trace, stderr := nvmlSession(t, func() (gpustat.Source, error) { return nil, why })
	<-s.sampler.done
	for range 3 {
		s.takeNVML()
	}
	if want := "cudatrace: NVML unavailable: Driver Not Loaded; tracing goes on without the driver's figures\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	if s.res.NVMLError != why.Error() || s.res.NVML != nil {
		t.Errorf("result: error %q, sample %v", s.res.NVMLError, s.res.NVML)
	}
	frames := nvmlFrames(t, s, trace)
	if len(frames) != 1 || frames[0].Error != why.Error() || frames[0].Devices != nil || frames[0].Time == 0 {
		t.Errorf("frames %+v, want one with the error", frames)
	}
}

// A failing query is a frame with the error and a warning, once.
func TestNVMLSampleFails(t *testing.T) {
	fake := &gpustat.Fake{Err: errors.New("device 0: nvmlDeviceGetMemoryInfo_v2: GPU is lost (15)")}
	s, trace, stderr := nvmlSession(t, func() (gpustat.Source, error) { return fake, nil })
	deadline := time.Now().Add(10 * time.Second)
	for stderr.Len() == 0 && time.Now().Before(deadline) {
		s.takeNVML()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	s.takeNVML()
	if want := "cudatrace: warning: NVML sample: device 0: nvmlDeviceGetMemoryInfo_v2: GPU is lost (15)\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr, want)
	}
	frames := nvmlFrames(t, s, trace)
	if len(frames) < 2 || frames[1].Error != fake.Err.Error() {
		t.Errorf("frames %+v, want each with the error", frames)
	}
}

// TestNVMLCloseWhileOpening: a session that ends while NVML is still
// initialising (seconds, where the library is there and the driver is
// not) does not wait for it; the sampler closes the Source it then gets,
// without sampling it.
func TestNVMLCloseWhileOpening(t *testing.T) {
	release := make(chan struct{})
	fake := &gpustat.Fake{}
	s := startSampler(func() (gpustat.Source, error) { <-release; return fake, nil }, time.Millisecond)
	closed := make(chan struct{})
	go func() { s.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("close waited for NVML to open")
	}
	close(release)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sampler did not end after its open returned")
	}
	if !fake.Closed || fake.Calls != 0 {
		t.Errorf("the Source opened after close: closed %v, sampled %d times; want closed, never sampled", fake.Closed, fake.Calls)
	}
}
