package record

import (
	"fmt"
	"io"
	"syscall"
	"time"
)

// Stage is one step of the reader's work on an event (session.Record).
type Stage int

// The stages, in the order an event goes through them.
const (
	StageDecode Stage = iota // the ring-buffer record into an events.Event
	StagePython              // code objects new to the process named
	StageUnwind              // the stack window unwound from call-frame information, the record re-encoded
	StageName                // container processes' frames queued for naming
	StageWrite               // the trace frame written (buffered)
	StageLedger              // the ledger, Python frames merged in, and the observer
	numStages
)

var stageNames = [numStages]string{"decode", "python", "unwind", "name", "write", "ledger"}

func (s Stage) String() string { return stageNames[s] }

// ReaderStats is what the reader spent on the events of a session
// (Options.ReaderStats): the process's own CPU time from its first event
// to its last, and the time in each stage on the reader's goroutine.
type ReaderStats struct {
	Events uint64
	// CPU is the tracer process's user+system time from the first event to
	// the tick after the last: every goroutine, the ring buffer's reading,
	// the runtime and the kernel's side of its system calls included.
	CPU    time.Duration
	Stages [numStages]time.Duration

	start  time.Duration // process CPU at the first event
	ticked uint64        // Events at the last tick that took CPU
	last   time.Time     // when the current stage began
}

// processCPU is the process's user+system time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// begin starts an event's first stage. Like done, it does nothing on a nil
// r (no -v): a test and a branch an event, once inlined.
func (r *ReaderStats) begin() {
	if r != nil {
		r.beginTimed()
	}
}

func (r *ReaderStats) beginTimed() {
	if r.Events == 0 {
		r.start = processCPU()
	}
	r.Events++
	r.last = time.Now()
}

// done ends stage st and starts the next. Small enough to be inlined:
// without -v the six calls an event are six tests of a nil pointer, where
// they were six calls.
func (r *ReaderStats) done(st Stage) {
	if r != nil {
		r.doneTimed(st)
	}
}

func (r *ReaderStats) doneTimed(st Stage) {
	now := time.Now()
	r.Stages[st] += now.Sub(r.last)
	r.last = now
}

// tick takes the process's CPU time so far when events came since the
// last tick: the figure ends with the last of them, before the probes'
// detaching at the end (which costs the kernel tens of ms) is counted.
func (r *ReaderStats) tick() {
	if r != nil && r.Events > r.ticked {
		r.ticked = r.Events
		r.CPU = processCPU() - r.start
	}
}

// Write prints r: CPU per event, and each stage's share of it.
func (r *ReaderStats) Write(w io.Writer) {
	if r.Events == 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(r.Events) }
	fmt.Fprintf(w, "cudatrace: reader: %d events, %.0f ns of process CPU per event;", r.Events, per(r.CPU))
	var staged time.Duration
	for st := range numStages {
		fmt.Fprintf(w, " %s %.0f", st, per(r.Stages[st]))
		staged += r.Stages[st]
	}
	fmt.Fprintf(w, ", ring reading and the rest %.0f ns per event (stages timed on the reader's goroutine)\n", per(r.CPU-staged))
}
