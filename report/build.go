// Package report turns a trace file into what a user reads: per-process
// and per-device memory, the stacks holding the most memory, and failed
// allocations, as a text table or JSON.
package report

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Options tune Load and the text output.
type Options struct {
	NoSymbolize bool // leave frames as addresses
	Top         int  // stacks in the text report; 0 means DefaultTop
}

// DefaultTop is how many stacks the text report shows.
const DefaultTop = 20

// Report is a trace, accounted and symbolized. Its JSON form is the
// `cudatrace report --json` contract (README.md).
type Report struct {
	LostEvents uint64            `json:"lost_events"`
	Events     uint64            `json:"events"`
	Trace      TraceInfo         `json:"trace"`
	Processes  []Process         `json:"processes"`
	Stacks     []Stack           `json:"stacks"`
	Failures   []Failure         `json:"failures"`
	Libraries  []Library         `json:"libraries"`
	Counters   map[string]uint64 `json:"counters"`
	Warning    string            `json:"warning,omitempty"`

	top         int
	cmdlineSeen cmdlineSet
}

// TraceInfo describes the recording.
type TraceInfo struct {
	Path       string    `json:"path"`
	Tool       string    `json:"tool"`
	Host       string    `json:"host"`
	Kernel     string    `json:"kernel"`
	Start      time.Time `json:"start"`
	DurationNS uint64    `json:"duration_ns"`
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
	LiveBytes       uint64   `json:"live_bytes"`
	PeakBytes       uint64   `json:"peak_bytes"`
	PeakTime        string   `json:"peak_time,omitempty"`
	HostLiveBytes   uint64   `json:"host_live_bytes"`
	HostPeakBytes   uint64   `json:"host_peak_bytes"`
	LiveAllocations int      `json:"live_allocations"`
	UnknownFrees    uint64   `json:"unknown_frees"`
	Devices         []Device `json:"devices"`
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

// Frame is one symbolized frame. Function is "" where no symbol covers the
// address.
type Frame struct {
	Function string `json:"function"`
	File     string `json:"file"`
	Line     int    `json:"line"`
	Module   string `json:"module"`
	Address  string `json:"address"`
	Offset   uint64 `json:"offset"`
}

// Failure is one failed allocation call.
type Failure struct {
	PID    uint32  `json:"pid"`
	TID    uint32  `json:"tid"`
	API    string  `json:"api"`
	Size   uint64  `json:"size"`
	Device int32   `json:"device"`
	Result int32   `json:"result"`
	Error  string  `json:"error"`
	Time   string  `json:"time"`
	Frames []Frame `json:"frames"`
}

// Library is a library the probes were attached to.
type Library struct {
	Path    string   `json:"library"`
	BuildID string   `json:"build_id,omitempty"`
	Symbols []string `json:"symbols"`
	Missing []string `json:"missing,omitempty"`
}

// Load reads and accounts a whole trace. A trace cut short (the tracer was
// killed) or damaged is reported up to the damage, with Warning saying so.
func Load(path string, opts Options) (*Report, error) {
	r, err := tracefile.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()

	ledger := events.NewLedger()
	maps := map[uint32][]proc.Mapping{}             // latest capture per PID
	stackMaps := map[*events.Stack][]proc.Mapping{} // as they were at the stack's first event
	rep := &Report{Counters: map[string]uint64{}, top: opts.Top}
	meta := r.Meta()
	var last uint64
	var end *tracefile.End
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if !errors.Is(err, tracefile.ErrTruncated) && !errors.Is(err, tracefile.ErrCorrupt) {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			rep.Warning = fmt.Sprintf("%v; the report covers the trace up to there", err)
			break
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			ev := rec.Event
			rep.Events++
			last = max(last, ev.End())
			ledger.Apply(ev)
			if ev.API.Info().Op == events.OpAlloc {
				if st := ledger.StackOf(ev.PID, ev.Stack); st != nil && stackMaps[st] == nil {
					stackMaps[st] = maps[ev.PID]
				}
			}
		case tracefile.TypeProcess:
			maps[rec.Process.PID] = rec.Process.Maps
			rep.addCmdline(rec.Process)
		case tracefile.TypeAttach:
			a := rec.Attach
			rep.Libraries = append(rep.Libraries, Library{Path: a.Library, BuildID: a.BuildID, Symbols: a.Symbols, Missing: a.Missing})
		case tracefile.TypeCounters:
			rep.Counters = rec.Counters.Counters
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
		rep.Warning = "no end record: the tracer did not stop cleanly (killed?); the report covers what was written"
	}

	var sym *symbolize.Symbolizer
	if !opts.NoSymbolize {
		sym = symbolize.New()
		defer sym.Close()
	}
	frames := func(st *events.Stack) []Frame {
		return symbolizeStack(sym, stackMaps[st], st.Frames)
	}
	cmdlines := rep.cmdlines()
	rep.Processes = []Process{}
	rep.Failures = []Failure{}
	for _, p := range ledger.Processes() {
		out := Process{PID: p.PID, Comm: p.Comm, Cmdline: cmdlines[p.PID], Allocs: p.Allocs, Frees: p.Frees,
			Failed: p.Failed, AllocBytes: p.AllocBytes, LiveBytes: p.Live, PeakBytes: p.Peak,
			HostLiveBytes: p.HostLive, HostPeakBytes: p.HostPeak, UnknownFrees: p.UnknownFrees,
			LiveAllocations: len(p.LiveAllocations()), Devices: []Device{}}
		if p.PeakTime != 0 {
			out.PeakTime = meta.WallTime(p.PeakTime).Format(time.RFC3339Nano)
		}
		for _, d := range p.DeviceList() {
			out.Devices = append(out.Devices, Device{Device: d.Device, LiveBytes: d.Live, PeakBytes: d.Peak})
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
			continue // only failed calls came from it: listed under failures
		}
		rep.Stacks = append(rep.Stacks, Stack{PID: st.PID, Allocs: st.Allocs, AllocBytes: st.AllocBytes,
			LiveBytes: st.Live, LiveCount: st.LiveCount, Frames: frames(st)})
	}
	if rep.Libraries == nil {
		rep.Libraries = []Library{}
	}
	return rep, nil
}

// cmdline bookkeeping: the first capture of a PID names its command.
type cmdlineSet map[uint32][]string

func (r *Report) addCmdline(p *tracefile.Process) {
	if r.cmdlineSeen == nil {
		r.cmdlineSeen = cmdlineSet{}
	}
	if _, ok := r.cmdlineSeen[p.PID]; !ok && len(p.Cmdline) > 0 {
		r.cmdlineSeen[p.PID] = p.Cmdline
	}
}

func (r *Report) cmdlines() cmdlineSet { return r.cmdlineSeen }

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
