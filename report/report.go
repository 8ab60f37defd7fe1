// Package report turns a trace file into what a user reads: per-process
// and per-device memory, the stacks holding the most memory, and failed
// allocations, as a text table or JSON. Its models (Process, Failure,
// Frame) are built from a ledger in one place (build.go), which record's
// summary and the agent's OOM dump use too.
package report

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Options tune Load and the text output. The zero value symbolizes and
// shows DefaultTop stacks.
type Options struct {
	// NoSymbolize leaves frames as addresses. It is a negative so that the
	// zero Options symbolizes.
	NoSymbolize bool
	// Top is how many stacks the text report shows, and how many per
	// process the peak lists; 0 means DefaultTop.
	Top int
	// PIDs limits the report to these processes; empty means all.
	PIDs []uint32
	// MinAge, when not 0, lists leak candidates: allocations still live at
	// the end that were made at least this long before it.
	MinAge time.Duration
	// Interval, when not 0, adds a row per process, device and interval
	// of this length with the change in live bytes and how far above it
	// they peaked (fastai's PeakMemMetric per epoch).
	Interval time.Duration
	// Allocations lists every allocation live at the end (the JSON export).
	Allocations bool
	// By, when set, adds the view by function or by source line (views.go).
	By By
}

func (o *Options) selected(pid uint32) bool { return len(o.PIDs) == 0 || slices.Contains(o.PIDs, pid) }

func (o *Options) top() int {
	if o.Top <= 0 {
		return DefaultTop
	}
	return o.Top
}

// DefaultTop is how many stacks the text report shows.
const DefaultTop = 20

// Report is a trace, accounted and symbolized. Its JSON form is the
// `cudatrace report --json` contract: lost_events, processes, stacks and
// failures are what scripts (and vmtest) rely on; the rest is extra.
type Report struct {
	LostEvents uint64 `json:"lost_events"`
	// LostStopping: of LostEvents, those lost after the recording's stop
	// began (probes firing while they were removed): the figures up to the
	// stop miss none of them.
	LostStopping uint64    `json:"lost_while_stopping"`
	Events       uint64    `json:"events"` // event records read
	Trace        TraceInfo `json:"trace"`
	Warning      string    `json:"warning,omitempty"`
	// SymbolWarning says how many frames of processes that ran in
	// containers could not be named, and what to do about it.
	SymbolWarning string    `json:"symbol_warning,omitempty"`
	Processes     []Process `json:"processes"` // by PID
	Stacks        []Stack   `json:"stacks"`    // one per call path, both levels side by side (stacks.go)
	Failures      []Failure `json:"failures"`  // by PID, then in time order
	// PeakStacks are, per process, the stacks holding its GPU memory at
	// the moment of its peak: what to shrink to lower the peak.
	PeakStacks []PeakStack `json:"peak_stacks"`
	// Owners are, per process, where its GPU memory went by owner (package
	// owner), at the end and at its peak (owners.go).
	Owners []ProcessOwners `json:"owners"`
	// Leaks lists, with Options.MinAge, allocations still live at the end
	// and at least that old, grouped by stack, most bytes first.
	Leaks      []Leak     `json:"leaks,omitempty"`
	MinAgeNS   uint64     `json:"min_age_ns,omitempty"`
	Intervals  []Interval `json:"intervals,omitempty"`
	IntervalNS uint64     `json:"interval_ns,omitempty"`
	// Allocations, with Options.Allocations, is the live set at the end.
	Allocations []Allocation `json:"allocations,omitempty"`
	// By and View: with Options.By, the rows by function or line.
	By   By        `json:"by,omitempty"`
	View []ViewRow `json:"view,omitempty"`
	// NVML is the driver's view sampled while recording; nil for a trace
	// without it (--nvml=false, or an older cudatrace).
	NVML      *NVMLSummary      `json:"nvml,omitempty"`
	Libraries []Library         `json:"libraries"`
	Counters  map[string]uint64 `json:"counters"` // the BPF side's, from the last snapshot
	// Jobs are the distributed jobs the processes belong to, each with
	// its ranks' figures, their imbalance and its first failure (jobs.go).
	Jobs []Job `json:"jobs,omitempty"`
	// Nodes, for a merged trace, are the traces it was made of and how
	// their clocks were aligned (jobs.go).
	Nodes []Node `json:"nodes,omitempty"`

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
	Signal     string    `json:"signal,omitempty"` // that killed the command
}

// Process is one process's account.
type Process struct {
	PID             uint32   `json:"pid"`
	Comm            string   `json:"comm"`
	Cmdline         []string `json:"cmdline,omitempty"`
	Container       string   `json:"container,omitempty"` // container ID, from the cgroup
	PodUID          string   `json:"pod_uid,omitempty"`   // Kubernetes pod UID
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
	// Allocations the driver freed with their context (cuCtxDestroy,
	// cuCtxDetach to 0, a primary context's last release or reset,
	// cudaDeviceReset), not counted in frees; host memory included.
	ImplicitFrees     uint64 `json:"implicit_frees"`
	ImplicitFreeBytes uint64 `json:"implicit_free_bytes"`
	// The process ended during the trace (its last thread exited), at
	// exit_time. What it still held of GPU memory then (allocations and
	// bytes; pinned host memory and tensors in host_held_at_exit_bytes and
	// tensor_held_at_exit_bytes) was released when it ended, as the driver
	// frees it: not counted in frees or implicit_frees. The figures "at
	// the end" (live_bytes, live_allocations, host and tensor live bytes,
	// per device too, the stacks' live bytes, leak candidates, exports'
	// live sets) are, for such a process, what it held when it ended.
	Exited                bool   `json:"exited,omitempty"`
	ExitTime              string `json:"exit_time,omitempty"` // RFC 3339
	HeldAtExitAllocs      uint64 `json:"held_at_exit_allocs,omitempty"`
	HeldAtExitBytes       uint64 `json:"held_at_exit_bytes,omitempty"`
	HostHeldAtExitBytes   uint64 `json:"host_held_at_exit_bytes,omitempty"`
	TensorHeldAtExitBytes uint64 `json:"tensor_held_at_exit_bytes,omitempty"`
	// Allocations live when the trace began, made before it (an agent's
	// /trace window starts with the agent's live set), and their bytes:
	// in live_bytes, not in allocs and alloc_bytes.
	BeforeAllocs uint64 `json:"before_allocs,omitempty"`
	BeforeBytes  uint64 `json:"before_bytes,omitempty"`
	// Tensors: what PyTorch's caching allocator handed out of the segments
	// above (its pytorch:malloc/free probes), in the bytes asked for:
	// memory_stats()'s requested_bytes (memory_allocated rounds each up to
	// its block). The pytorch owner's live_bytes is its memory_reserved;
	// cuBLAS's and cuDNN's own segments are beside it. 0 without them.
	TensorAllocs       uint64 `json:"tensor_allocs"`
	TensorFrees        uint64 `json:"tensor_frees"`
	TensorAllocBytes   uint64 `json:"tensor_alloc_bytes"`
	TensorLiveBytes    uint64 `json:"tensor_live_bytes"`
	TensorPeakBytes    uint64 `json:"tensor_peak_bytes"`
	UnknownTensorFrees uint64 `json:"unknown_tensor_frees"`
	// VMM virtual ranges (cuMemMap, cuMemAddressReserve): no memory of
	// their own, the physical memory behind them is in live_bytes from
	// cuMemCreate. 0 where the driver's VMM API was not used.
	VMMMappedBytes     uint64    `json:"vmm_mapped_bytes"`
	VMMMappedPeakBytes uint64    `json:"vmm_mapped_peak_bytes"`
	VMMMaps            uint64    `json:"vmm_maps"`
	VMMUnmaps          uint64    `json:"vmm_unmaps"`
	VMMFailedMaps      uint64    `json:"vmm_failed_maps"`
	VMMUnknownUnmaps   uint64    `json:"vmm_unknown_unmaps"`
	VAReservedBytes    uint64    `json:"va_reserved_bytes"`
	VMMMappings        []Mapping `json:"vmm_mappings,omitempty"` // live at the end, by address
	Devices            []Device  `json:"devices"`                // by ordinal
	// CaptureError says why the process's mappings are missing or
	// incomplete (it exited before the recorder read them): its stacks are
	// then not symbolized.
	CaptureError string `json:"capture_error,omitempty"`
	// PythonFrames counts the distinct Python frames (code object and
	// instruction) of a CPython process's stacks; UnresolvedPythonFrames
	// those whose code object could not be read (freed before cudatrace
	// read it), shown as "[unresolved Python frame: why]" in the stacks.
	PythonFrames           int `json:"python_frames,omitempty"`
	UnresolvedPythonFrames int `json:"unresolved_python_frames,omitempty"`
	// NVML is the driver's figure beside the traced one; nil when the
	// trace has no NVML samples.
	NVML *ProcessNVML `json:"nvml,omitempty"`
	// Job is the process's place in a distributed job (job and rank), as
	// its environment gave it; nil when it is in none. JobError says why
	// it is unknown where its environment could not be read.
	Job      *ProcessJob `json:"job,omitempty"`
	JobError string      `json:"job_error,omitempty"`
	// Node is the host it ran on, in a merged trace (cudatrace merge);
	// NodePID its PID there, where the merge numbered it otherwise.
	Node    string `json:"node,omitempty"`
	NodePID uint32 `json:"node_pid,omitempty"`
}

// Mapping is a live VMM mapping: size bytes of the physical memory
// handle names, mapped at addr.
type Mapping struct {
	Addr   uint64 `json:"addr"`
	Size   uint64 `json:"size"`
	Handle uint64 `json:"handle"`
	Device int32  `json:"device"`
	// Released: the handle was released while mapped; the memory goes
	// when its last mapping does.
	Released bool `json:"released,omitempty"`
}

// Device is one process's use of one GPU.
type Device struct {
	Device int32 `json:"device"`
	// Unknown: device is events.DeviceUnknown (-1), the memory of threads
	// that chose their device before tracing began and had not said which
	// when they allocated. Never guessed.
	Unknown         bool   `json:"unknown,omitempty"`
	LiveBytes       uint64 `json:"live_bytes"`
	PeakBytes       uint64 `json:"peak_bytes"`
	TensorLiveBytes uint64 `json:"tensor_live_bytes"`
	TensorPeakBytes uint64 `json:"tensor_peak_bytes"`
	// GPU memory freed with its context on this device.
	ImplicitFrees     uint64 `json:"implicit_frees"`
	ImplicitFreeBytes uint64 `json:"implicit_free_bytes"`
	// GPU memory the process held on this device when it ended (in
	// live_bytes: the figure at its end).
	HeldAtExitAllocs uint64 `json:"held_at_exit_allocs,omitempty"`
	HeldAtExitBytes  uint64 `json:"held_at_exit_bytes,omitempty"`
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

// Short names f in a few words, the same in every process that runs the
// same files: "function (file:line)", the function alone, or the module's
// base name and offset (its address where the offset is not known: this
// process's only); "" for a frame with none of them. The agent's
// stack label and record's budget lines use it.
func (f Frame) Short() string {
	switch {
	case f.Function != "" && f.File != "":
		return fmt.Sprintf("%s (%s:%d)", f.Function, path.Base(f.File), f.Line)
	case f.Function != "":
		return f.Function
	case f.Module != "" && f.Offset != 0:
		return fmt.Sprintf("%s+%#x", path.Base(f.Module), f.Offset)
	case f.Module != "":
		// Its file's headers were not read: its address, never "+0x0",
		// which every such frame of the module would read.
		return fmt.Sprintf("%s@%s", path.Base(f.Module), f.Address)
	}
	return ""
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
	// The process's GPU memory live when the call failed, in all and on
	// its device, and the stacks holding most of the device's (for the
	// first failures of each process).
	LiveBytes       uint64       `json:"live_bytes"`
	DeviceLiveBytes uint64       `json:"device_live_bytes"`
	LiveStacks      []StackShare `json:"live_stacks,omitempty"`
}

// PeakStack is one stack's share of a process's GPU memory at its peak.
type PeakStack struct {
	PID       uint32  `json:"pid"`
	LiveBytes uint64  `json:"live_bytes"` // at the peak
	LiveCount uint64  `json:"live_count"`
	Frames    []Frame `json:"frames"`
}

// StackShare is one stack's share of a live set.
type StackShare struct {
	LiveBytes uint64  `json:"live_bytes"`
	LiveCount uint64  `json:"live_count"`
	Frames    []Frame `json:"frames"`
}

// Leak is a group of old allocations still live at the end, from one stack.
type Leak struct {
	PID         uint32 `json:"pid"`
	LiveBytes   uint64 `json:"live_bytes"`
	LiveCount   uint64 `json:"live_count"`
	OldestAgeNS uint64 `json:"oldest_age_ns"` // before the end of the trace
	// Host: pinned host memory (cudaHostAlloc and the like), not GPU
	// memory, which LIVE does not count; a stack with both is two.
	Host   bool    `json:"host,omitempty"`
	Frames []Frame `json:"frames"`
}

// Interval is one process's use of one device over one interval: the
// columns fastai's PeakMemMetric prints per epoch.
type Interval struct {
	PID       uint32 `json:"pid"`
	Device    int32  `json:"device"`
	StartNS   uint64 `json:"start_ns"` // since the start of the recording
	EndNS     uint64 `json:"end_ns"`
	LiveStart uint64 `json:"live_start"`
	LiveEnd   uint64 `json:"live_end"`
	Peak      uint64 `json:"peak"`   // highest live bytes in the interval
	Used      int64  `json:"used"`   // LiveEnd - LiveStart
	Peaked    uint64 `json:"peaked"` // Peak - max(LiveStart, LiveEnd): memory needed only for a while
}

// Allocation is one allocation live at the end.
type Allocation struct {
	PID     uint32 `json:"pid"`
	TID     uint32 `json:"tid"`
	Address string `json:"address"` // "0x…"
	Size    uint64 `json:"size"`
	Device  int32  `json:"device"`
	API     string `json:"api"`
	Kind    string `json:"kind"`  // device, managed or host
	Time    string `json:"time"`  // RFC 3339, when the call returned
	Stack   int    `json:"stack"` // index in stacks
}

// Library is a library the probes were attached to.
type Library struct {
	Path    string   `json:"library"`
	BuildID string   `json:"build_id,omitempty"`
	Symbols []string `json:"symbols"`
	Missing []string `json:"missing,omitempty"` // symbols the library lacks
	// A library attached after tracing began, when a traced process had
	// loaded it (dlopen): how long after the start, which process, and how
	// many of its events came before. Its calls before the attach were
	// not traced.
	LateNS       uint64 `json:"late_ns,omitempty"`
	LatePID      uint32 `json:"late_pid,omitempty"`
	EventsBefore uint64 `json:"events_before,omitempty"`
	// LoadedNS is when the process mapped it, from the start (its
	// loader's notification); 0 when not known (a periodic scan of its
	// mappings found it). Between LoadedNS and LateNS its calls into the
	// library were not traced: how many there were cannot be known.
	LoadedNS uint64 `json:"loaded_ns,omitempty"`
}

// Load reads and accounts a whole trace. A trace cut short (the tracer was
// killed) or damaged part way is reported up to the damage, with Warning
// saying so; a file that is not a trace, or of a later format version, is
// an error.
func Load(path string, opts Options) (*Report, error) {
	t0, err := tracefile.Open(path) // for the start time, which --interval counts from
	if err != nil {
		return nil, err
	}
	fol := newFollower(t0.Meta().StartBoot, uint64(opts.Interval))
	nv := newNVMLFollower(t0.Meta().StartBoot, opts.Interval)
	t0.Close()
	var vf *viewFollower
	onEvent := fol.onEvent
	if opts.By != "" {
		vf = newViewFollower(t0.Meta().StartBoot, uint64(opts.Interval))
		onEvent = func(ev *events.Event, ch ledger.Change) error {
			vf.onEvent(ev, ch)
			return fol.onEvent(ev, ch)
		}
	}
	last := map[uint32]uint64{} // each process's latest event: where a cut-short node's trace ends
	follow := onEvent
	onEvent = func(ev *events.Event, ch ledger.Change) error {
		last[ev.PID] = max(last[ev.PID], ev.End())
		return follow(ev, ch)
	}
	t, err := replay.Read(path, replay.Options{OnEvent: onEvent, OnNVML: nv.onNVML})
	if err != nil {
		return nil, err
	}
	if err := t.CheckPIDs(opts.PIDs); err != nil {
		return nil, err
	}
	meta := t.Meta
	rep := &Report{LostEvents: t.Lost, LostStopping: t.LostStopping, Events: t.Events, Counters: t.Counters, Warning: t.Warning,
		Libraries: []Library{}, top: opts.Top}
	for _, a := range t.Libraries {
		lib := Library{Path: a.Library, BuildID: a.BuildID, Symbols: nonNil(a.Symbols), Missing: a.Missing,
			LatePID: a.PID, EventsBefore: a.EventsBefore}
		if a.Time > meta.StartBoot {
			lib.LateNS = a.Time - meta.StartBoot
		}
		if a.Loaded > meta.StartBoot {
			lib.LoadedNS = a.Loaded - meta.StartBoot
		}
		rep.Libraries = append(rep.Libraries, lib)
	}
	rep.Trace = TraceInfo{Path: path, Tool: meta.Tool, Host: meta.Host, Kernel: meta.Kernel,
		Start: meta.StartWall, DurationNS: t.DurationNS(), Command: meta.Command, PIDs: meta.PIDs, All: meta.All,
		Complete: t.End != nil}
	if t.End != nil {
		rep.Trace.StopReason, rep.Trace.ExitCode, rep.Trace.Signal = t.End.Reason, t.End.ExitCode, t.End.Signal
	}

	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	frames := func(st *ledger.Stack) []Frame { return Frames(syms.Frames(st)) }

	rep.Processes = []Process{}
	rep.Failures = []Failure{}
	for _, p := range t.Ledger.Processes() {
		if !opts.selected(p.PID) {
			continue
		}
		out := NewProcess(p, meta.WallTime)
		if c := t.First(p.PID); c != nil {
			out.Cmdline, out.Container, out.PodUID = c.Cmdline, c.Container, c.Pod
			out.Identify(c)
		}
		if c := t.Latest(p.PID); c != nil {
			out.CaptureError = c.Error
		}
		if py := t.Procs.Python(p.PID); py != nil {
			out.PythonFrames, out.UnresolvedPythonFrames = py.Len(), py.Unresolved()
		}
		out.NVML = nv.process(p.PID)
		if c := t.First(p.PID); out.NVML != nil && out.NVML.Samples > 0 && c != nil && runningBefore(&meta, c.Start) {
			out.NVML.HeldBeforeBytes = out.NVML.FirstRemainderBytes
		}
		rep.Processes = append(rep.Processes, out)
		for i := range p.Failures {
			var ctx *FailureContext
			if fcs := fol.failures[p.PID]; i < len(fcs) {
				ctx = &fcs[i]
			}
			rep.Failures = append(rep.Failures, NewFailure(p.PID, &p.Failures[i], ctx, meta.WallTime, frames))
		}
	}

	peaks, peakLive, err := fol.peakStacks(t)
	if err != nil {
		return nil, err
	}
	rep.PeakStacks = []PeakStack{}
	for _, p := range rep.Processes {
		stacks := peaks[p.PID]
		for _, s := range stacks[:min(len(stacks), opts.top())] {
			rep.PeakStacks = append(rep.PeakStacks, PeakStack{PID: p.PID, LiveBytes: s.Bytes, LiveCount: s.Count, Frames: frames(s.Stack)})
		}
	}
	rep.Owners = buildOwners(t, rep.Processes, peakLive)
	if opts.MinAge > 0 {
		rep.MinAgeNS = uint64(opts.MinAge)
		rep.Leaks = leaks(t, &opts, frames)
	}
	rep.NVML = nv.summary(meta.All && len(opts.PIDs) == 0, func(pid uint32) bool { return t.Ledger.Process(pid) != nil },
		opts.selected)
	if nv.overflowed {
		return nil, fmt.Errorf("--interval %s makes more than %d rows of NVML samples: choose a longer one", opts.Interval, maxIntervals)
	}
	if opts.Interval > 0 {
		rep.IntervalNS = uint64(opts.Interval)
		var overflowed bool
		rep.Intervals, overflowed = fol.intervals(t.Last)
		if overflowed {
			return nil, fmt.Errorf("--interval %s makes more than %d rows per process and device: choose a longer one", opts.Interval, maxIntervals)
		}
	}

	var index map[*ledger.Stack]int
	rep.Stacks, index = buildStacks(t.Ledger.Stacks(), opts.selected, frames)
	if opts.By != "" {
		rep.By = opts.By
		rep.View = buildView(t.Ledger.Stacks(), opts.By, opts.selected, frames, vf)
	}
	if opts.Allocations {
		rep.Allocations = []Allocation{}
		for _, p := range t.Ledger.Processes() {
			if !opts.selected(p.PID) {
				continue
			}
			segs, _ := p.AtEnd()
			for _, a := range segs {
				rep.Allocations = append(rep.Allocations, Allocation{PID: p.PID, TID: a.TID,
					Address: fmt.Sprintf("%#x", a.Addr), Size: a.Size, Device: a.Device, API: a.API.String(),
					Kind: a.API.Info().Kind.String(), Time: meta.WallTime(a.Time).Format(time.RFC3339Nano),
					Stack: index[a.Stack]})
			}
		}
	}
	rep.Nodes = nodes(t)
	if rep.Jobs, err = buildJobs(t, rep, frames, last); err != nil {
		return nil, err
	}
	if n := syms.Gone(); n > 0 {
		rep.SymbolWarning = fmt.Sprintf("%s not named: %s", plural(n, "frame"), replay.GoneHint)
	}
	return rep, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// leaks groups by stack the allocations live at the end that are at least
// opts.MinAge old.
func leaks(t *replay.Trace, opts *Options, frames func(*ledger.Stack) []Frame) []Leak {
	type group struct {
		st           *ledger.Stack
		host         bool
		bytes, count uint64
		oldest       uint64 // time of the oldest allocation
	}
	type key struct {
		st   *ledger.Stack
		host bool
	}
	var groups []*group
	for _, p := range t.Ledger.Processes() {
		if !opts.selected(p.PID) {
			continue
		}
		by := map[key]*group{}
		segs, _ := p.AtEnd() // an ended process: what it held at exit
		for _, a := range segs {
			if a.Time > t.Last || t.Last-a.Time < uint64(opts.MinAge) {
				continue
			}
			k := key{a.Stack, a.API.Info().Kind == events.KindHost}
			g := by[k]
			if g == nil {
				g = &group{st: a.Stack, host: k.host, oldest: a.Time}
				by[k] = g
				groups = append(groups, g)
			}
			g.bytes += a.Size
			g.count++
			g.oldest = min(g.oldest, a.Time)
		}
	}
	slices.SortFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(b.count, a.count), cmp.Compare(a.st.PID, b.st.PID),
			slices.Compare(a.st.Frames, b.st.Frames), cmp.Compare(b2int(a.host), b2int(b.host)))
	})
	out := []Leak{}
	for _, g := range groups {
		out = append(out, Leak{PID: g.st.PID, LiveBytes: g.bytes, LiveCount: g.count, OldestAgeNS: t.Last - g.oldest,
			Host: g.host, Frames: frames(g.st)})
	}
	return out
}

func b2int(v bool) int {
	if v {
		return 1
	}
	return 0
}
