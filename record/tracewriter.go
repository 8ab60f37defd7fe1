package record

import (
	"io"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/clock"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

// TraceWriter is the one writer of trace files: `record -o` and the
// agent's /trace windows both write through it, so a window is the same
// file a recording is. It is a tracefile.Writer that also names the native
// frames of the trace once each (WriteNames) and ends a trace the one way
// (Finish).
type TraceWriter struct {
	*tracefile.Writer
	named map[nameKey]bool
}

type nameKey struct {
	buildID string
	off     uint64
}

// TraceMeta is the metadata of a trace that tool ("cudatrace v1.2", "…
// agent") starts now on this machine; the caller adds what it traces
// (Command, PIDs, All).
func TraceMeta(tool string) tracefile.Meta {
	host, _ := os.Hostname()
	meta := tracefile.Meta{Tool: tool, Host: host}
	// The pair that puts this trace on a timeline with other nodes'
	// (cudatrace merge), and how well the wall clock was kept then.
	meta.StartWall, meta.StartBoot, meta.ClockPair = clock.Pair()
	if s, ok := clock.ReadSync(); ok {
		meta.Clock = &tracefile.ClockSync{Synced: s.Synced, EstError: uint64(s.EstError), MaxError: uint64(s.MaxError)}
	}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		meta.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	return meta
}

// CreateTrace creates the trace file at path.
func CreateTrace(path string, meta tracefile.Meta) (*TraceWriter, error) {
	w, err := tracefile.Create(path, meta)
	if err != nil {
		return nil, err
	}
	return &TraceWriter{Writer: w}, nil
}

// NewTraceWriter writes a trace to out.
func NewTraceWriter(out io.Writer, meta tracefile.Meta) (*TraceWriter, error) {
	w, err := tracefile.NewWriter(out, meta)
	if err != nil {
		return nil, err
	}
	return &TraceWriter{Writer: w}, nil
}

// WriteNames writes the names of native frames (a symbols frame) that the
// trace does not hold yet: each (build ID, file offset) is named once.
func (w *TraceWriter) WriteNames(names []procmodel.Symbol) error {
	var out []procmodel.Symbol
	for _, n := range names {
		k := nameKey{n.BuildID, n.Offset}
		if w.named[k] {
			continue
		}
		if w.named == nil {
			w.named = map[nameKey]bool{}
		}
		w.named[k] = true
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil
	}
	return w.WriteSymbols(procmodel.SymbolsFile(out))
}

// Finish ends the trace: the last counters, the end frame (both stamped
// now) and the file closed, whatever failed first.
func (w *TraceWriter) Finish(c tracefile.Counters, e tracefile.End) error {
	c.Time, e.Time = BootNow(), BootNow()
	err := w.WriteCounters(&c)
	if err == nil {
		err = w.WriteEnd(&e)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}

// BootNow is the trace's clock now: CLOCK_BOOTTIME in nanoseconds, the
// clock of the BPF side's records (clock.Boot).
func BootNow() uint64 { return clock.Boot() }
