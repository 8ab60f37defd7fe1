package record

import (
	"context"
	"fmt"
	"time"

	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/tracefile"
)

// DefaultNVMLEvery is how often the driver's view is sampled.
const DefaultNVMLEvery = time.Second

// nvmlSample is one sample, or why there is none.
type nvmlSample struct {
	time   uint64 // boot ns: when the processes' query began (gpustat.Take)
	sample gpustat.Sample
	err    error
	open   bool // err is Open's: NVML is not there at all
}

// sampler reads NVML on its own goroutine: a query takes milliseconds per
// device, and the reader goroutine must keep draining the ring buffer. It
// owns the Source. The latest sample waits in a one-slot channel; one the
// reader has not taken yet is replaced.
type sampler struct {
	out    chan nvmlSample
	opened chan struct{} // closed when open has returned
	done   chan struct{}
	stop   context.CancelFunc
}

func startSampler(open func() (gpustat.Source, error), every time.Duration) *sampler {
	if every <= 0 {
		every = DefaultNVMLEvery
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &sampler{out: make(chan nvmlSample, 1), opened: make(chan struct{}), done: make(chan struct{}), stop: stop}
	go s.run(ctx, open, every)
	return s
}

func (s *sampler) run(ctx context.Context, open func() (gpustat.Source, error), every time.Duration) {
	defer close(s.done)
	src, err := open()
	close(s.opened)
	if err != nil {
		s.put(nvmlSample{time: BootNow(), err: err, open: true})
		return
	}
	defer src.Close()
	if ctx.Err() != nil {
		return // closed while opening
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		sm, at, err := gpustat.Take(src, BootNow)
		if err != nil {
			at = BootNow()
		}
		s.put(nvmlSample{time: at, sample: sm, err: err})
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *sampler) put(sm nvmlSample) {
	for {
		select {
		case s.out <- sm:
			return
		default:
		}
		select {
		case <-s.out: // the reader has not taken the last one: this is newer
		default:
		}
	}
}

// close stops the sampler and waits for it to close its Source. One still
// opening it is not waited for (NVML's initialisation can take seconds
// where the library is there and the driver is not): it closes what it
// opens and ends on its own, and the session's end does not wait on it.
func (s *sampler) close() {
	s.stop()
	select {
	case <-s.opened:
		<-s.done
	default:
	}
}

// takeNVML writes a sample waiting from the sampler to the trace and the
// result. It runs on the reader goroutine.
func (s *session) takeNVML() {
	if s.sampler == nil {
		return
	}
	var sm nvmlSample
	select {
	case sm = <-s.sampler.out:
	default:
		return
	}
	frame := &tracefile.NVML{Time: sm.time}
	switch {
	case sm.open:
		s.res.NVMLError = sm.err.Error()
		frame.Error = sm.err.Error()
		fmt.Fprintf(s.opts.Stderr, "cudatrace: %v; tracing goes on without the driver's figures\n", sm.err)
	case sm.err != nil:
		frame.Error = sm.err.Error()
		s.warn(fmt.Errorf("NVML sample: %w", sm.err))
	default:
		s.res.NVML, s.res.NVMLTime = &sm.sample, sm.time
		frame.Devices, frame.Processes = NVMLFrame(sm.sample)
	}
	if s.w == nil {
		return
	}
	if err := s.w.WriteNVML(frame); err != nil {
		s.warn(err)
	}
}

// NVMLFrame converts a sample to the trace's form.
func NVMLFrame(sm gpustat.Sample) ([]tracefile.NVMLDevice, []tracefile.NVMLProcess) {
	var devs []tracefile.NVMLDevice
	for _, d := range sm.Devices {
		devs = append(devs, tracefile.NVMLDevice{Index: d.Index, UUID: d.UUID, Name: d.Name, Total: d.Total, Used: d.Used, Free: d.Free})
	}
	var procs []tracefile.NVMLProcess
	for _, p := range sm.Processes {
		procs = append(procs, tracefile.NVMLProcess{PID: p.PID, Device: p.Device, UUID: p.UUID, Used: p.Used})
	}
	return devs, procs
}
