package agent

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/container"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/otlp"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/symbolize"
)

// ProcessStats is a copy of one process's account.
type ProcessStats struct {
	PID       uint32
	Comm      string
	Cmdline   []string
	Container string // container ID, "" on the host
	PodUID    string // Kubernetes pod UID, "" outside a pod
	// The kubelet's names of its container, when the agent has them
	// (Options.Pods; agent.namesOf says when): "" otherwise.
	Namespace, Pod, ContainerName string
	Exited                        bool // gone; kept until the retention passes
	// Job and Rank are its distributed job and rank, from its environment
	// (package jobid): "" and -1 when it is in none.
	Job  string
	Rank int

	Allocs, Frees, Failed, AllocBytes uint64
	UnknownFrees                      uint64
	ImplicitFrees, ImplicitFreeBytes  uint64 // freed with their context
	TensorAllocs, TensorFrees         uint64
	Live, Peak                        uint64
	HostLive, HostPeak                uint64
	TensorLive, TensorPeak            uint64
	OOMs                              uint64
	Devices                           []ledger.Device // by ordinal
	// Owners is its live GPU memory by device and owner (package owner).
	Owners []OwnerLive
}

// StackStats is the GPU memory one of a process's allocation stacks
// holds live on one device (segments: device and managed memory).
type StackStats struct {
	PID    uint32
	Device int32
	Live   uint64
	// Stack names its innermost StackFrames frames, innermost first,
	// joined by " < " (stackLabel).
	Stack string
}

// Stacks per process in Stats.TopStacks, and the frames that name one.
const (
	TopStacks   = 5
	StackFrames = 4
)

// NodeStats is the GPU memory of the running traced processes, summed
// per device and level, and the highest the sum reached since the agent
// started.
type NodeStats struct {
	Device     int32
	Tensor     bool // tensor level (PyTorch's allocator); else segments
	Live, Peak uint64
}

// Stats is a copy of the agent's state for /metrics.
type Stats struct {
	Processes []ProcessStats // by PID
	Node      []NodeStats    // by device, segments first
	Totals    Totals
	Events    uint64            // records read
	Lost      uint64            // events the BPF side lost
	Counters  map[string]uint64 // the BPF side's counters
	Stacks    int               // distinct stacks held
	// TopStacks are each running process's TopStacks stacks holding
	// the most GPU memory on a device, by PID, then most bytes first.
	TopStacks []StackStats
	Start     time.Time
	// The flight recorder: the events its histories hold, and the bytes
	// they account for (within Options.HistoryBudget).
	HistoryEvents int
	HistoryBytes  int64
	// NVML is the driver's view (record.Options.NVML), nil without it;
	// NVMLError says why it is missing or stale.
	NVML      *gpustat.Sample
	NVMLError string
	// Maps are the BPF maps keyed by process, thread or file and their
	// entries at the latest count; ExitsSwept the process ends the
	// session's sweep found (record.Result).
	Maps       []record.MapUse
	ExitsSwept uint64
	MapsFull   uint64 // the reader's own updates that found a map full (BPF's: Counters["map_full"])
	// OTLP is the OTLP exporter's counters; nil without one.
	OTLP *otlp.Stats
}

// Stats copies the agent's state.
func (a *Agent) Stats(ctx context.Context) (*Stats, error) {
	var (
		s   *Stats
		top []liveStack
		src *liveStacks
	)
	err := a.do(ctx, func() {
		s = a.stats()
		if !a.opts.NoTopStacks {
			top, src = a.topStacks()
		}
	})
	if err != nil {
		return nil, err
	}
	// Named here, off the reader goroutine. Two stacks whose innermost
	// frames are the same are one series.
	at := map[StackStats]int{}
	for _, t := range top {
		k := StackStats{PID: t.pid, Device: t.device, Stack: stackLabel(src.Frames(t.stack))}
		if i, ok := at[k]; ok {
			s.TopStacks[i].Live += t.live
			continue
		}
		at[k] = len(s.TopStacks)
		k.Live = t.live
		s.TopStacks = append(s.TopStacks, k)
	}
	return s, nil
}

// liveStack is what one stack of a process holds on one device.
type liveStack struct {
	pid    uint32
	device int32
	stack  *ledger.Stack
	live   uint64
}

// topStacks copies each running process's TopStacks stacks holding the
// most GPU memory (segments), and what naming them needs.
func (a *Agent) topStacks() ([]liveStack, *liveStacks) {
	var out []liveStack
	src := a.stacksFor()
	for _, pid := range a.pids() {
		ps, p := a.procs[pid], a.ledger.Process(pid)
		if ps == nil || p == nil || !ps.exitedAt.IsZero() {
			continue
		}
		type key struct {
			st  *ledger.Stack
			dev int32
		}
		sum := map[key]uint64{}
		for _, al := range p.LiveAllocations() {
			if al.API.Info().Kind != events.KindHost {
				sum[key{al.Stack, al.Device}] += al.Size
			}
		}
		var mine []liveStack
		for k, v := range sum {
			mine = append(mine, liveStack{pid: pid, device: k.dev, stack: k.st, live: v})
		}
		sort.Slice(mine, func(i, j int) bool {
			if mine[i].live != mine[j].live {
				return mine[i].live > mine[j].live
			}
			if mine[i].device != mine[j].device {
				return mine[i].device < mine[j].device
			}
			return slices.Compare(framesOf(mine[i].stack), framesOf(mine[j].stack)) < 0
		})
		if len(mine) > TopStacks {
			mine = mine[:TopStacks]
		}
		for _, m := range mine {
			src.add(a, m.stack)
		}
		out = append(out, mine...)
	}
	return out, src
}

func framesOf(st *ledger.Stack) []uint64 {
	if st == nil {
		return nil
	}
	return st.Frames
}

// stackLabel names a stack by its innermost StackFrames frames, each
// "function (file:line)", or the module and offset where the function is
// unknown (never a runtime address: those differ from process to process).
func stackLabel(frames []symbolize.Frame) string {
	var parts []string
	for _, f := range report.Frames(frames[:min(len(frames), StackFrames)]) {
		parts = append(parts, cmp.Or(f.Short(), "?"))
	}
	return strings.Join(parts, " < ")
}

func (a *Agent) stats() *Stats {
	s := &Stats{Totals: a.totals, Events: a.res.Events, Lost: a.res.Lost, Counters: map[string]uint64{},
		Stacks: a.model.Stacks(), Start: a.start, NVML: a.res.NVML, NVMLError: a.res.NVMLError,
		HistoryEvents: a.hist.events(), HistoryBytes: a.hist.bytes(), Maps: a.res.Maps, ExitsSwept: a.res.ExitsSwept,
		MapsFull: a.res.MapsFull}
	for k, v := range a.res.Counters {
		s.Counters[k] = v
	}
	if a.opts.OTLP != nil {
		o := a.opts.OTLP.Stats()
		s.OTLP = &o
	}
	pids := a.pids()
	names := a.podNames(pids)
	for _, pid := range pids {
		ps := a.procs[pid]
		p := a.ledger.Process(pid)
		if p == nil {
			continue // seen, but no event applied yet
		}
		st := a.processStats(ps, p)
		n := names[pid]
		st.Namespace, st.Pod, st.ContainerName = n.Namespace, n.Pod, n.Container
		s.Processes = append(s.Processes, st)
	}
	for k, u := range a.node {
		s.Node = append(s.Node, NodeStats{Device: k.device, Tensor: k.tensor, Live: u.live, Peak: u.peak})
	}
	sort.Slice(s.Node, func(i, j int) bool {
		if s.Node[i].Device != s.Node[j].Device {
			return s.Node[i].Device < s.Node[j].Device
		}
		return !s.Node[i].Tensor && s.Node[j].Tensor
	})
	return s
}

func (a *Agent) processStats(ps *procState, p *ledger.Process) ProcessStats {
	out := ProcessStats{PID: p.PID, Comm: p.Comm, Container: ps.container.ID, PodUID: ps.container.PodUID,
		Exited: !ps.exitedAt.IsZero(), Allocs: p.Allocs, Frees: p.Frees, Failed: p.Failed, AllocBytes: p.AllocBytes,
		UnknownFrees: p.UnknownFrees, ImplicitFrees: p.ImplicitFrees, ImplicitFreeBytes: p.ImplicitFreeBytes,
		TensorAllocs: p.TensorAllocs, TensorFrees: p.TensorFrees,
		Live: p.Live, Peak: p.Peak, HostLive: p.HostLive, HostPeak: p.HostPeak,
		TensorLive: p.TensorLive, TensorPeak: p.TensorPeak, OOMs: ps.ooms, Rank: -1}
	if c := a.model.Get(p.PID); c != nil && c.First != nil {
		out.Cmdline = c.First.Cmdline
		out.Job, out.Rank = c.First.JobID(), c.First.Rank()
	}
	for _, d := range p.DeviceList() {
		out.Devices = append(out.Devices, *d)
	}
	out.Owners = ownerList(&ps.owners)
	return out
}

// Profile writes the live set as a pprof heap profile (gzipped): inuse_*
// is what is live now, alloc_* the allocations made since the last call
// (by any caller) that covered them. pid 0 means every process. Profiles
// are built outside the reader goroutine, from copies.
func (a *Agent) Profile(ctx context.Context, w io.Writer, pid uint32) error {
	var (
		lp  *export.LiveProfile
		src *liveStacks
		err error
	)
	if rerr := a.do(ctx, func() { lp, src, err = a.profile(pid, a.scraped, &a.lastScrape) }); rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	return export.WriteLivePprof(w, lp, src)
}

// profile copies the live set of pid (0: every process) and the
// allocations since the baseline's (the pprof scrapes' or the OTLP pushes'),
// which it moves to now (a whole profile only: since *last).
func (a *Agent) profile(pid uint32, baseline map[export.SampleKey][2]int64, last *time.Time) (*export.LiveProfile, *liveStacks, error) {
	pids := a.pids()
	if pid != 0 {
		if a.ledger.Process(pid) == nil {
			return nil, nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		pids = []uint32{pid}
	}
	now := time.Now()
	lp := &export.LiveProfile{Samples: export.Samples{}, Comm: map[uint32]string{}, Labels: map[uint32]map[string]string{}, Time: now,
		Duration: now.Sub(*last),
		Comment: fmt.Sprintf("cudatrace agent: GPU memory; inuse_* is the live set at %s, alloc_* the allocations since %s",
			now.Format(time.RFC3339), last.Format(time.RFC3339))}
	if pid == 0 {
		*last = now
	}
	names := a.podNames(a.pids())
	for _, pid := range pids {
		p := a.ledger.Process(pid)
		ps := a.procs[pid]
		if p == nil || ps == nil {
			continue
		}
		lp.Comm[pid] = p.Comm
		n, ok := names[pid]
		if !ok && !ps.exitedAt.IsZero() { // kept with its account
			n = ps.names
		}
		lp.Labels[pid] = profileLabels(ps.container, n)
		if c := a.model.Get(pid); c != nil {
			export.JobLabels(lp.Labels[pid], c.First)
		}
		lp.Samples.AddLive(p.LiveAllocations(), p.LiveTensors())
		for _, k := range ps.keys {
			v := a.allocs[k]
			old := baseline[k]
			if d0, d1 := v[0]-old[0], v[1]-old[1]; d0 != 0 || d1 != 0 {
				lp.Samples.AddAlloc(k, d0, d1)
			}
			baseline[k] = *v
		}
	}
	src := a.stacksFor()
	for k := range lp.Samples {
		src.add(a, k.Stack)
	}
	return lp, src, nil
}

// profileLabels are a process's labels in the agent's profiles, as on
// its metrics: the IDs from the cgroup, the kubelet's names (empty ones
// are left out of the profile).
func profileLabels(c container.Info, n kube.Names) map[string]string {
	return map[string]string{"container_id": c.ID, "pod_uid": c.PodUID,
		"namespace": n.Namespace, "pod": n.Pod, "container": n.Container}
}

// Snapshot writes one process's live set as a PyTorch memory snapshot
// (pytorch.org/memory_viz): its segments, cut into its live tensors' blocks
// when it has PyTorch's tensor events, and, in device_traces, its latest
// events (the flight recorder's) after its latest out-of-memory failures.
func (a *Agent) Snapshot(ctx context.Context, w io.Writer, pid uint32) error {
	var (
		segs, tensors []*ledger.Allocation
		maps          []*ledger.Mapping
		trace         []export.LiveEntry
		src           *liveStacks
		level         bool
		err           error
	)
	rerr := a.do(ctx, func() {
		p := a.ledger.Process(pid)
		if p == nil {
			err = fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
			return
		}
		segs, tensors = p.AtEnd() // an ended process's: what it held at exit
		maps = p.Mappings()       // as they were at its end
		level = p.TensorAllocs > 0
		src = a.stacksFor()
		for _, al := range segs {
			src.add(a, al.Stack)
		}
		for _, al := range tensors {
			src.add(a, al.Stack)
		}
		// The flight recorder's latest events, after the latest OOMs it
		// no longer holds.
		history := a.hist.list(pid)
		for _, e := range a.oomEntries(p, a.procs[pid], snapshotOOMs) {
			if len(history) == 0 || e.TimeUS < a.wall(history[0].End).UnixMicro() {
				trace = append(trace, e)
				src.add(a, e.Stack)
			}
		}
		src.addHistory(a, history)
		trace = append(trace, export.HistoryEntries(history, segs, maps, tensors, level, a.wall)...)
	})
	if rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	snap, err := export.LiveSnapshot(segs, maps, tensors, level, trace, src)
	if err != nil {
		return err
	}
	return export.WriteMemviz(w, snap)
}

// oomEntries lists p's latest n out-of-memory failures as memviz oom
// entries, oldest first, each with the device's free memory then where the
// driver's sample said it (ps may be nil).
func (a *Agent) oomEntries(p *ledger.Process, ps *procState, n int) []export.LiveEntry {
	var out []export.LiveEntry
	for i := len(p.Failures) - 1; i >= 0 && len(out) < n; i-- {
		f := &p.Failures[i]
		if !events.IsOOM(f.Result) || f.Device < 0 {
			continue
		}
		e := export.LiveEntry{Action: export.MemvizOOM, Size: f.Size, Device: f.Device, Stack: f.Stack,
			TimeUS: a.wall(f.Time).UnixMicro()}
		if ps != nil {
			if free, ok := ps.oomFree[f.Time]; ok {
				e.DeviceFree = &free
			}
		}
		out = append(out, e)
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Known returns an error wrapping ErrNoProcess unless the agent holds an
// account of pid.
func (a *Agent) Known(ctx context.Context, pid uint32) error {
	var known bool
	if err := a.do(ctx, func() { known = a.procs[pid] != nil }); err != nil {
		return err
	}
	if !known {
		return fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
	}
	return nil
}
