// Package export writes a trace in the formats of the tools people already
// open: pprof profiles (go tool pprof, Pyroscope, Parca), PyTorch
// memory_viz snapshots, Chrome/Perfetto timelines and JSON. Every format is
// built from a replay of the trace file (package replay), so memory stays
// bounded by the live set and the distinct stacks, whatever the number of
// events. The agent writes its live profile and snapshots with the same
// code (live.go): a live set becomes pprof samples one way (Samples), for
// a trace and a running ledger alike. The pickle encoder under memviz is
// internal/pickle.
package export

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Format names an output format.
type Format string

// The formats `cudatrace export --format` takes.
const (
	FormatPprof    Format = "pprof"
	FormatMemviz   Format = "memviz"
	FormatPerfetto Format = "perfetto"
	FormatJSON     Format = "json"
	FormatHTML     Format = "html"
	// FormatOTLP is OpenTelemetry's profiles signal: an export request,
	// protobuf-encoded (otlp.go).
	FormatOTLP Format = "otlp"
)

// Formats lists the formats, in the order --help shows them.
func Formats() []Format {
	return []Format{FormatPprof, FormatMemviz, FormatPerfetto, FormatJSON, FormatHTML, FormatOTLP}
}

// ParseFormat checks a --format value.
func ParseFormat(s string) (Format, error) {
	f := Format(strings.ToLower(s))
	if slices.Contains(Formats(), f) {
		return f, nil
	}
	names := make([]string, 0, len(Formats()))
	for _, f := range Formats() {
		names = append(names, string(f))
	}
	return "", fmt.Errorf("unknown format %q (want one of %s)", s, strings.Join(names, ", "))
}

// Moment picks the instant whose live set a snapshot shows (pprof's inuse_*,
// memviz's segments). The zero Moment is the end of the trace.
type Moment struct {
	Peak bool          // when the traced GPU memory (all processes selected) was at its highest
	At   time.Duration // this long after the start of the recording, when not 0
}

// ParseMoment reads --at: "end" (or ""), "peak", or a duration since the
// start of the recording ("90s", "2m30s").
func ParseMoment(s string) (Moment, error) {
	switch strings.ToLower(s) {
	case "", "end":
		return Moment{}, nil
	case "peak":
		return Moment{Peak: true}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return Moment{}, fmt.Errorf("--at %q: want end, peak, or a duration after the start such as 90s", s)
	}
	return Moment{At: d}, nil
}

// String says the moment as --at takes it.
func (m Moment) String() string {
	switch {
	case m.Peak:
		return "peak"
	case m.At != 0:
		return m.At.String()
	}
	return "end"
}

// Options tune every format.
type Options struct {
	NoSymbolize bool     // frames as addresses only
	PIDs        []uint32 // only these processes; all when empty
	At          Moment   // the live set shown (pprof, memviz); the others cover the whole trace
	// MemvizEntries caps each device's memviz trace to its latest entries,
	// as PyTorch's _record_memory_history(max_entries=…) does; 0 means
	// DefaultMemvizEntries, MemvizNoTrace none (the segments alone), any
	// other negative no cap.
	MemvizEntries int
	// Top is, for the JSON report, how many stacks per process the peak
	// lists; 0 means report.DefaultTop.
	Top int
	// Warn, when set, hears what the output could not say: frames of
	// container processes nothing could name.
	Warn func(msg string)
	// OTLP is what the OTLP export adds to the profile (resource
	// attributes).
	OTLP OTLPOptions
}

// warnGone tells opts.Warn how many frames syms could not name.
func (o *Options) warnGone(syms *replay.Symbols) {
	if n := syms.Gone(); n > 0 && o.Warn != nil {
		o.Warn(fmt.Sprintf("%d frames not named: %s", n, replay.GoneHint))
	}
}

// checkReplay says, once the trace at path has been read to end, what
// makes the export wrong rather than empty: a --pid the trace does not
// have, a moment (until) past its end. It passes the replay's damage
// warning to o.Warn, as report prints it.
func (o *Options) checkReplay(t *replay.Trace, until uint64) error {
	if err := t.CheckPIDs(o.PIDs); err != nil {
		return err
	}
	if t.PastEnd(until) {
		return hint.Wrap(fmt.Errorf("--at %s is past the end of the trace, which lasts %s", o.At,
			time.Duration(t.DurationNS()).Round(time.Millisecond)), "give a time within it, or --at end")
	}
	if t.Warning != "" && o.Warn != nil {
		o.Warn(t.Warning)
	}
	return nil
}

// MemvizNoTrace, as Options.MemvizEntries, leaves the memviz trace out:
// a snapshot of the segments at the moment alone, as
// torch.cuda.memory._snapshot() gives without _record_memory_history.
const MemvizNoTrace = -2

// DefaultMemvizEntries is how many trace entries per device a memviz
// snapshot keeps by default: the memory_viz page stays responsive, and
// the segments, which show the live set, are never cut.
const DefaultMemvizEntries = 100_000

// selected reports whether opts let pid through.
func (o *Options) selected(pid uint32) bool {
	return len(o.PIDs) == 0 || slices.Contains(o.PIDs, pid)
}

// until returns the replay.Options.Until that stops a replay at m: 0 for
// the end. Finding the peak takes a pass of its own over the trace.
func until(path string, m Moment, opts *Options) (uint64, error) {
	switch {
	case m.Peak:
		return peakTime(path, opts)
	case m.At != 0:
		r, err := tracefile.Open(path)
		if err != nil {
			return 0, err
		}
		defer r.Close()
		return r.Meta().StartBoot + uint64(m.At), nil
	}
	return 0, nil
}

// peakTime finds when the GPU memory of the selected processes, summed, was
// at its highest (the first time it got there).
func peakTime(path string, opts *Options) (uint64, error) {
	var live, peak, when uint64
	_, err := replay.Read(path, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		if ch.Process == nil || !opts.selected(ch.Process.PID) {
			return nil
		}
		for a := range ch.AllFreed() {
			if a.API.Segment() {
				live -= a.Size
			}
		}
		if a := ch.Alloc; a != nil && a.API.Segment() {
			live += a.Size
			if live > peak {
				peak, when = live, a.Time
			}
		}
		return nil
	}})
	if err != nil {
		return 0, err
	}
	if when == 0 {
		return 0, fmt.Errorf("%s: no GPU memory was allocated, so there is no peak (try --at end)", path)
	}
	return when, nil
}

// Write writes the trace at path to w in format f.
func Write(w io.Writer, path string, f Format, opts Options) error {
	switch f {
	case FormatPprof:
		return WritePprof(w, path, opts)
	case FormatMemviz:
		return WriteMemvizTrace(w, path, opts)
	case FormatPerfetto:
		return WritePerfetto(w, path, opts)
	case FormatJSON:
		return WriteJSON(w, path, opts)
	case FormatHTML:
		return WriteHTML(w, path, opts)
	case FormatOTLP:
		return WriteOTLP(w, path, opts, opts.OTLP)
	}
	_, err := ParseFormat(string(f))
	return err
}
