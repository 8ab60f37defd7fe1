// Package report turns a trace file into what a user reads: per-process
// and per-device memory, the stacks holding the most memory, and failed
// allocations, as a text table or JSON.
package report

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Options tune Load and the text output. The zero value symbolizes and
// shows DefaultTop stacks.
type Options struct {
	// NoSymbolize leaves frames as addresses. It is a negative so that the
	// zero Options symbolizes.
	NoSymbolize bool
	// Top is how many stacks the text report shows; 0 means DefaultTop.
	Top int
}

// DefaultTop is how many stacks the text report shows.
const DefaultTop = 20

// Report is a trace, accounted and symbolized. Its JSON form is the
// `cudatrace report --json` contract: lost_events, processes, stacks and
// failures are what scripts (and vmtest) rely on; the rest is extra.
type Report struct {
	LostEvents uint64            `json:"lost_events"`
	Events     uint64            `json:"events"` // event records read
	Trace      TraceInfo         `json:"trace"`
	Warning    string            `json:"warning,omitempty"`
	Processes  []Process         `json:"processes"` // by PID
	Stacks     []Stack           `json:"stacks"`    // most live bytes first, then most allocated
	Failures   []Failure         `json:"failures"`  // by PID, then in time order
	Libraries  []Library         `json:"libraries"`
	Counters   map[string]uint64 `json:"counters"` // the BPF side's, from the last snapshot

	top int // Options.Top
}

// TraceInfo describes the recording.
type TraceInfo struct {
	Path       string    `json:"path"`
	Tool       string    `json:"tool"`
	Host       string    `json:"host"`
	Kernel     string    `json:"kernel"`
	Start      time.Time `json:"start"`
	DurationNS uint64    `json:"duration_ns"` // start to the last thing recorded
	Command    []string  `json:"command,omitempty"`
	PIDs       []int     `json:"pids,omitempty"`
	All        bool      `json:"all,omitempty"`
	Complete   bool      `json:"complete"` // the end record is there
	StopReason string    `json:"stop_reason,omitempty"`
	ExitCode   int       `json:"exit_code,omitempty"`
}

// Process is one process's account.
type Process struct {
	PID             uint32   `json:"pid"`
	Comm            string   `json:"comm"`
	Cmdline         []string `json:"cmdline,omitempty"`
	Allocs          uint64   `json:"allocs"`
	Frees           uint64   `json:"frees"`
	Failed          uint64   `json:"failed"`
	AllocBytes      uint64   `json:"alloc_bytes"`
	LiveBytes       uint64   `json:"live_bytes"` // GPU memory (device and managed) at the end
	PeakBytes       uint64   `json:"peak_bytes"`
	PeakTime        string   `json:"peak_time,omitempty"` // RFC 3339, when PeakBytes was reached
	HostLiveBytes   uint64   `json:"host_live_bytes"`     // pinned host memory
	HostPeakBytes   uint64   `json:"host_peak_bytes"`
	LiveAllocations int      `json:"live_allocations"`
	UnknownFrees    uint64   `json:"unknown_frees"`
	Replaced        uint64   `json:"replaced"` // allocations at a live address: a free was lost
	Devices         []Device `json:"devices"`  // by ordinal
	// CaptureError says why the process's mappings are missing or
	// incomplete (it exited before the recorder read them): its stacks are
	// then not symbolized.
	CaptureError string `json:"capture_error,omitempty"`
}

// Device is one process's use of one GPU.
type Device struct {
	Device    int32  `json:"device"`
	LiveBytes uint64 `json:"live_bytes"`
	PeakBytes uint64 `json:"peak_bytes"`
}

// Stack is the allocations made from one call stack of one process.
type Stack struct {
	PID        uint32  `json:"pid"`
	Allocs     uint64  `json:"allocs"`
	AllocBytes uint64  `json:"alloc_bytes"`
	LiveBytes  uint64  `json:"live_bytes"`
	LiveCount  uint64  `json:"live_count"`
	Frames     []Frame `json:"frames"` // innermost first
}

// Frame is one frame of a stack. Function, File and Module are "" where
// they are unknown; Address is always set.
type Frame struct {
	Function string `json:"function"`
	File     string `json:"file"`
	Line     int    `json:"line"`
	Module   string `json:"module"`  // path of the mapped file, as symbolize.Frame gives it
	Address  string `json:"address"` // the return address captured, "0x…"
	Offset   uint64 `json:"offset"`  // the address as an ELF virtual address in Module
}

// Failure is one failed allocation call.
type Failure struct {
	PID    uint32  `json:"pid"`
	TID    uint32  `json:"tid"`
	API    string  `json:"api"`
	Size   uint64  `json:"size"`
	Device int32   `json:"device"`
	Result int32   `json:"result"`
	Error  string  `json:"error"` // Result's name
	Time   string  `json:"time"`  // RFC 3339, nanoseconds
	Frames []Frame `json:"frames"`
}

// Library is a library the probes were attached to.
type Library struct {
	Path    string   `json:"library"`
	BuildID string   `json:"build_id,omitempty"`
	Symbols []string `json:"symbols"`
	Missing []string `json:"missing,omitempty"` // symbols the library lacks
}

// Load reads and accounts a whole trace. A trace cut short (the tracer was
// killed) or damaged part way is reported up to the damage, with Warning
// saying so; a file that is not a trace, or of a later format version, is
// an error.
func Load(path string, opts Options) (*Report, error) {
	r, err := tracefile.Open(path)
	if err != nil {
		return nil, err // Open names the path
	}
	defer r.Close()
	meta := r.Meta()

	rep := &Report{Counters: map[string]uint64{}, Libraries: []Library{}, top: opts.Top}
	ledger := events.NewLedger()
	var (
		maps      = map[uint32][]proc.Mapping{} // latest capture per PID
		captured  = map[uint32]*tracefile.Process{}
		cmdlines  = map[uint32][]string{} // the first capture's
		stackMaps = map[*events.Stack][]proc.Mapping{}
		// Stacks first seen before any capture of their process: they take
		// the first capture that comes.
		pending = map[uint32][]*events.Stack{}
		last    uint64 // latest time recorded
		end     *tracefile.End
	)
read:
	for {
		rec, err := r.Next()
		switch {
		case err == io.EOF:
			break read
		case errors.Is(err, tracefile.ErrTruncated):
			rep.Warning = fmt.Sprintf("trace truncated: %s (the tracer was killed, or the disk filled); the report covers the events before it",
				cause(err, tracefile.ErrTruncated))
			break read
		case errors.Is(err, tracefile.ErrCorrupt):
			rep.Warning = fmt.Sprintf("trace damaged: %s; the report covers the events before it",
				cause(err, tracefile.ErrCorrupt))
			break read
		case err != nil:
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			ev := rec.Event
			rep.Events++
			last = max(last, ev.End())
			ledger.Apply(ev)
			if ev.API.Info().Op != events.OpAlloc {
				break
			}
			// A stack is symbolized with its process's mappings as they
			// were when it was first seen: a later capture (after a
			// dlopen or an exec) describes the addresses of later events.
			st := ledger.StackOf(ev.PID, ev.Stack)
			if _, seen := stackMaps[st]; st == nil || seen {
				break
			}
			m, ok := maps[ev.PID]
			stackMaps[st] = m
			if !ok {
				pending[ev.PID] = append(pending[ev.PID], st)
			}
		case tracefile.TypeProcess:
			p := rec.Process
			maps[p.PID] = p.Maps
			captured[p.PID] = p
			if _, ok := cmdlines[p.PID]; !ok {
				cmdlines[p.PID] = p.Cmdline
			}
			for _, st := range pending[p.PID] {
				stackMaps[st] = p.Maps
			}
			delete(pending, p.PID)
			last = max(last, p.Time)
		case tracefile.TypeAttach:
			a := rec.Attach
			rep.Libraries = append(rep.Libraries, Library{Path: a.Library, BuildID: a.BuildID,
				Symbols: nonNil(a.Symbols), Missing: a.Missing})
		case tracefile.TypeCounters:
			if rec.Counters.Counters != nil {
				rep.Counters = rec.Counters.Counters
			}
			rep.LostEvents = rec.Counters.Lost
			last = max(last, rec.Counters.Time)
		case tracefile.TypeEnd:
			end = rec.End
			last = max(last, end.Time)
		}
	}

	rep.Trace = TraceInfo{Path: path, Tool: meta.Tool, Host: meta.Host, Kernel: meta.Kernel,
		Start: meta.StartWall, Command: meta.Command, PIDs: meta.PIDs, All: meta.All, Complete: end != nil}
	if last > meta.StartBoot {
		rep.Trace.DurationNS = last - meta.StartBoot
	}
	if end != nil {
		rep.Trace.StopReason, rep.Trace.ExitCode = end.Reason, end.ExitCode
	} else if rep.Warning == "" {
		rep.Warning = "no end record: the tracer did not stop cleanly (killed?); the report covers what it wrote"
	}

	var sym *symbolize.Symbolizer
	if !opts.NoSymbolize {
		sym = symbolize.New()
		defer sym.Close()
	}
	// Failures share their stacks with each other: symbolize each once.
	done := map[*events.Stack][]Frame{}
	frames := func(st *events.Stack) []Frame {
		if st == nil {
			return []Frame{}
		}
		f, ok := done[st]
		if !ok {
			f = symbolizeStack(sym, stackMaps[st], st.Frames)
			done[st] = f
		}
		return f
	}

	rep.Processes = []Process{}
	rep.Failures = []Failure{}
	for _, p := range ledger.Processes() {
		out := Process{PID: p.PID, Comm: p.Comm, Cmdline: cmdlines[p.PID], Allocs: p.Allocs, Frees: p.Frees,
			Failed: p.Failed, AllocBytes: p.AllocBytes, LiveBytes: p.Live, PeakBytes: p.Peak,
			HostLiveBytes: p.HostLive, HostPeakBytes: p.HostPeak, UnknownFrees: p.UnknownFrees,
			Replaced: p.Replaced, LiveAllocations: len(p.LiveAllocations()), Devices: devices(p)}
		if p.PeakTime != 0 {
			out.PeakTime = meta.WallTime(p.PeakTime).Format(time.RFC3339Nano)
		}
		if c := captured[p.PID]; c != nil {
			out.CaptureError = c.Error
		}
		rep.Processes = append(rep.Processes, out)
		for _, f := range p.Failures {
			rep.Failures = append(rep.Failures, Failure{PID: p.PID, TID: f.TID, API: f.API.String(), Size: f.Size,
				Device: f.Device, Result: f.Result, Error: events.ErrorName(f.Result),
				Time: meta.WallTime(f.Time).Format(time.RFC3339Nano), Frames: frames(f.Stack)})
		}
	}

	rep.Stacks = []Stack{}
	for _, st := range ledger.Stacks() {
		if st.Allocs == 0 {
			continue // only failed calls came from it: they are under failures
		}
		rep.Stacks = append(rep.Stacks, Stack{PID: st.PID, Allocs: st.Allocs, AllocBytes: st.AllocBytes,
			LiveBytes: st.Live, LiveCount: st.LiveCount, Frames: frames(st)})
	}
	return rep, nil
}

// cause is err's text without the sentinel it wraps, which the warning
// says in its own words.
func cause(err, sentinel error) string {
	return strings.TrimSuffix(err.Error(), ": "+sentinel.Error())
}

func devices(p *events.Process) []Device {
	out := []Device{}
	for _, d := range p.DeviceList() {
		out = append(out, Device{Device: d.Device, LiveBytes: d.Live, PeakBytes: d.Peak})
	}
	return out
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// symbolizeStack symbolizes pcs against maps, or only formats their
// addresses when sym is nil.
func symbolizeStack(sym *symbolize.Symbolizer, maps []proc.Mapping, pcs []uint64) []Frame {
	out := make([]Frame, 0, len(pcs))
	if sym == nil {
		for _, pc := range pcs {
			out = append(out, Frame{Address: fmt.Sprintf("%#x", pc)})
		}
		return out
	}
	for _, f := range sym.Frames(maps, pcs) {
		out = append(out, Frame{Function: f.Function, File: f.File, Line: f.Line, Module: f.Module,
			Address: fmt.Sprintf("%#x", f.Addr), Offset: f.Offset})
	}
	return out
}
