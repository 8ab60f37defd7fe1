// Package agent is the node daemon's logic: it watches a system-wide
// tracing session (record.Run with All, through record.Observer), keeps
// each process's account bounded (exited processes age out), writes the
// OOM black box, and answers the HTTP layer's questions (agent/httpapi)
// with copies.
//
// Concurrency: the session's ledger, and every map of the agent, belong to
// the reader goroutine that calls the Observer methods. Other goroutines
// never touch them: they queue a request (a function) that the next Tick
// runs on the reader goroutine (within the poll interval, 50 ms), and read
// what it copied. Copies hold *ledger.Stack and *ledger.Allocation
// pointers, but only their fields that never change after creation
// (PID, Frames, Tensor; an Allocation's every field but Ctx, which the
// ledger alone reads and sets when a thread's context is learned).
//
// docs/architecture.md places it among the other packages.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/container"
	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/kube"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/otlp"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Options tune an Agent.
type Options struct {
	// Retention is how long an exited process's account stays (for
	// /snapshot, the profile and the trace's process frames) before it
	// is dropped. 0 means DefaultRetention.
	Retention time.Duration
	// DumpDir receives the OOM black box; "" writes none.
	DumpDir string
	// DumpEvery rate-limits the dumps of one process: a job retrying a
	// failing allocation in a loop gets one dump per DumpEvery. 0 means
	// DefaultDumpEvery.
	DumpEvery time.Duration
	// HistoryEvents is how many of a process's latest events the flight
	// recorder keeps (history.go); 0 means DefaultHistoryEvents, negative
	// none. HistoryBudget caps the bytes all processes' histories take
	// together; 0 means DefaultHistoryBudget.
	HistoryEvents int
	HistoryBudget int64
	// NoSymbolize leaves frames as addresses in every output.
	NoSymbolize bool
	// Pods names the Kubernetes pod, namespace and container of a
	// process in a pod, from the kubelet's pod-resources API; nil: none.
	Pods *kube.Lister
	// Runtime names a process in a pod from its container's labels, over
	// the container runtime's CRI, by the container ID of its cgroup (exact
	// on any GPU sharing); nil: none.
	Runtime *kube.CRI
	// NoTopStacks leaves Stats.TopStacks empty, sparing each Stats its
	// pass over the live set (the metrics without process labels have
	// no use for them).
	NoTopStacks bool
	// OTLP, when set, receives the live profile every OTLPInterval
	// (otlp.go); OTLPResource are resource attributes of every process
	// pushed (host.name, k8s.node.name, service.name).
	OTLP         *otlp.Exporter
	OTLPInterval time.Duration
	OTLPResource map[string]string
	Version      string
	Stderr       io.Writer // warnings
}

// Defaults.
const (
	DefaultRetention = 10 * time.Minute
	DefaultDumpEvery = time.Minute
	// exitScanEvery is how often the agent checks which processes are gone.
	exitScanEvery = time.Second
	// A /trace stream queues records while its client reads them: at most
	// traceQueueMax items, fewer for a short window (traceQueuePerSecond
	// per second of it, at least traceQueueMin: a channel's buffer is
	// allocated whole), and at most TraceWindowBytes of records. Past
	// either, records are dropped and counted in the window's losses.
	traceQueueMin       = 1 << 10
	traceQueuePerSecond = 1 << 10
	traceQueueMax       = 1 << 16
	// snapshotOOMs is how many of a process's latest OOM failures a
	// snapshot's device traces list.
	snapshotOOMs = 100
)

// TraceWindowBytes bounds the records one /trace window holds queued for
// its client: a window's memory is about this plus its queue's slots.
const TraceWindowBytes = 4 << 20

// ErrStopped is returned to requests made after the session ended.
var ErrStopped = errors.New("the agent's tracing session has ended")

// ErrNoProcess means the agent has no account of the process asked for.
var ErrNoProcess = errors.New("no such traced process")

// Agent watches a session. Its Observer methods run on the session's
// reader goroutine; every other method may be called from any goroutine.
type Agent struct {
	opts    Options
	syms    *symbolize.Symbolizer // nil: addresses only
	bootOff time.Duration         // wall clock minus CLOCK_BOOTTIME
	start   time.Time

	reqs    chan request
	stopped chan struct{} // closed by Close
	dumps   chan *oomDump
	dumper  chan struct{} // closed when the dump goroutine is done
	pusher  chan struct{} // closed when the OTLP push goroutine is done (nil: none)

	// Owned by the reader goroutine.
	ledger     *ledger.Ledger
	procs      map[uint32]*procState
	model      *procmodel.Processes           // captures, Python tables, the capture each stack is read against
	allocs     map[export.SampleKey]*[2]int64 // cumulative allocations per sample
	scraped    map[export.SampleKey][2]int64  // allocs at the last profile scrape
	lastScrape time.Time
	pushed     map[export.SampleKey][2]int64 // allocs at the last OTLP push (otlp.go)
	lastPush   time.Time
	node       map[devLevel]*nodeUse
	totals     Totals
	res        record.Result // counters and the NVML sample as of the last Tick
	subs       []*traceSub
	pending    []request // queued, not yet settled
	lastExit   time.Time
	hist       *recorder // the flight recorder: each process's latest events
}

// procState is the agent's account of a process beside the ledger and
// the process model (a.model: its captures, its Python frames' table,
// kept as long as the account, so that its stacks are named while it is
// retained).
type procState struct {
	start     uint64 // of its first capture (0: unknown)
	container container.Info
	seen      time.Time  // when the agent first saw it
	names     kube.Names // its container's, once known (namesOf)
	named     bool
	exact     bool            // named by the container runtime (CRI), not by GPU
	acct      *ledger.Process // its account in the session's ledger, from its latest event
	exitedAt  time.Time       // zero while it runs
	lastDump  time.Time
	ooms      uint64
	keys      []export.SampleKey
	// oomFree is the device's free memory (NVML's latest sample) at each
	// of the latest OOM failures, by the failure's time: /snapshot's oom
	// entries carry it as device_free. At most snapshotOOMs.
	oomFree map[uint64]uint64
	owners  owner.Live // live GPU memory by device and owner
}

// noteOOMFree keeps dev's free memory at a failure at time t, when the
// driver's sample knows it.
func (ps *procState) noteOOMFree(t uint64, free *uint64) {
	if free == nil {
		return
	}
	if ps.oomFree == nil {
		ps.oomFree = map[uint64]uint64{}
	}
	if len(ps.oomFree) >= snapshotOOMs { // drop the oldest
		oldest := t
		for k := range ps.oomFree {
			oldest = min(oldest, k)
		}
		delete(ps.oomFree, oldest)
	}
	ps.oomFree[t] = *free
}

// reusedBy reports whether a process started at start is another than
// the one ps describes (0: unknown, not another).
func (ps *procState) reusedBy(start uint64) bool {
	return ps.start != 0 && start != 0 && start != ps.start
}

// devLevel keys the node's totals.
type devLevel struct {
	device int32
	tensor bool
}

type nodeUse struct{ live, peak uint64 }

// Totals are the agent's own counters since it started; they never go
// down, even as processes age out.
type Totals struct {
	Allocs, Frees, Failed, AllocBytes uint64
	TensorAllocs, TensorFrees         uint64
	// Allocations freed with their context (cuCtxDestroy, cuDevicePrimaryCtxReset, ...), and their bytes.
	ImplicitFrees, ImplicitFreeBytes uint64
	OOMs                             uint64
	Dumps, DumpErrors, DumpsSkipped  uint64
	ProcessesSeen, ProcessesExited   uint64
	ProcessesForgotten               uint64
	TraceDropped                     uint64
}

type request struct {
	f    func()
	done chan struct{}
	at   time.Time // when it was queued
}

// settle is how old a request must be before it is served: records
// submitted before the request may still sit in the ring buffer (the BPF
// side wakes the reader only past a fill threshold, and the reader polls
// every 50 ms), and an answer must count them.
const settle = 120 * time.Millisecond

// New returns an Agent. Close it when the session has ended.
func New(opts Options) *Agent {
	if opts.Retention <= 0 {
		opts.Retention = DefaultRetention
	}
	if opts.DumpEvery <= 0 {
		opts.DumpEvery = DefaultDumpEvery
	}
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	if opts.HistoryEvents == 0 {
		opts.HistoryEvents = DefaultHistoryEvents
	}
	if opts.HistoryBudget <= 0 {
		opts.HistoryBudget = DefaultHistoryBudget
	}
	a := &Agent{
		opts:    opts,
		bootOff: time.Duration(time.Now().UnixNano() - int64(record.BootNow())),
		start:   time.Now(),
		reqs:    make(chan request, 64),
		stopped: make(chan struct{}),
		dumps:   make(chan *oomDump, 8),
		dumper:  make(chan struct{}),
		ledger:  ledger.New(), // replaced by the session's at the first Tick
		procs:   map[uint32]*procState{},
		model:   procmodel.New(),
		allocs:  map[export.SampleKey]*[2]int64{},
		scraped: map[export.SampleKey][2]int64{},
		pushed:  map[export.SampleKey][2]int64{},
		node:    map[devLevel]*nodeUse{},
		hist:    newRecorder(opts.HistoryEvents, opts.HistoryBudget),
	}
	a.lastScrape, a.lastPush = a.start, a.start
	if !opts.NoSymbolize {
		a.syms = symbolize.New()
	}
	go a.dumpLoop()
	if opts.OTLP != nil {
		a.pusher = make(chan struct{})
		go a.pushLoop()
	}
	return a
}

// Close ends the requests still waiting and the dump goroutine, after the
// dumps queued are written. Call it after record.Run returned.
func (a *Agent) Close() {
	select {
	case <-a.stopped:
		return
	default:
	}
	close(a.stopped)
	close(a.dumps)
	<-a.dumper
	if a.pusher != nil {
		<-a.pusher
	}
	for _, s := range a.subs {
		s.end()
	}
	a.subs = nil
	if a.syms != nil {
		a.syms.Close()
	}
}

// do runs f on the reader goroutine and waits for it.
func (a *Agent) do(ctx context.Context, f func()) error {
	r := request{f: f, done: make(chan struct{}), at: time.Now()}
	select {
	case a.reqs <- r:
	case <-a.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-r.done:
		return nil
	case <-a.stopped:
		return ErrStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wall converts a CLOCK_BOOTTIME timestamp to wall-clock time.
func (a *Agent) wall(boot uint64) time.Time { return time.Unix(0, int64(boot)+int64(a.bootOff)) }

// Process is record.Observer's: a process first seen, or its mappings
// read again.
func (a *Agent) Process(c *procmodel.Capture) {
	ps := a.procs[c.PID]
	if ps == nil || !ps.exitedAt.IsZero() || ps.reusedBy(c.Start) {
		if ps != nil {
			a.forget(c.PID) // the PID was reused
		}
		ps = &procState{start: c.Start, seen: time.Now()}
		a.procs[c.PID] = ps
		a.totals.ProcessesSeen++
	}
	if c.Container != "" || c.Pod != "" {
		if c.Pod != "" && ps.container.PodUID == "" {
			// A process in a pod: the kubelet's list may not have its
			// container yet (namesOf wants one taken after it was seen).
			a.opts.Pods.Refresh()
			// Asked of the runtime now, so its names are there by the
			// time a scrape or an OOM dump wants them.
			a.opts.Runtime.Names(c.Container)
		}
		ps.container = container.Info{ID: c.Container, PodUID: c.Pod}
	}
	a.model.Add(c)
	for _, s := range a.subs {
		s.process(c)
	}
}

// Python is record.Observer's: the table that names a CPython process's
// Python frames.
func (a *Agent) Python(pid uint32, t *pystack.Table) {
	if a.procs[pid] != nil {
		a.model.SetPython(pid, t)
	}
}

// Event is record.Observer's: one event, after the ledger applied it.
func (a *Agent) Event(ev *events.Event, ch ledger.Change) {
	if len(a.subs) > 0 {
		var py *pystack.Table
		if a.procs[ev.PID] != nil && ev.Flags&(events.FlagPython|events.FlagNoPython) != 0 {
			py = a.model.Python(ev.PID)
		}
		raw := events.Encode(nil, ev)
		for _, s := range a.subs {
			s.python(ev.PID, py, &a.totals)
			s.event(ev.PID, raw, &a.totals)
		}
	}
	p := ch.Process
	if p == nil {
		return
	}
	ps := a.procs[p.PID]
	if ps == nil { // an event before any capture: cannot happen with record, but be safe
		ps = &procState{}
		a.procs[p.PID] = ps
	}
	ps.acct = p
	if ch.Stack != nil {
		a.model.Bind(p.PID, ch.Stack)
	}
	// The process ended (bpf/exit.h): the ledger released what it held,
	// and the node's totals drop by it below, once.
	if ch.Exit {
		a.exited(ps)
	}
	if it, ok := historyItem(ev, ch); ok {
		if ch.Stack != nil && ch.Alloc == nil {
			it.DeviceFree = nvmlFree(a.res.NVML, ev.Device)
		}
		a.hist.add(p.PID, it)
	}
	// Every allocation the event released: a context's death (implicit
	// frees), a cuMemUnmap and a process's end may release several.
	for f := range ch.AllFreed() {
		switch {
		case ch.Exit: // held at exit: neither freed by it nor with a context
		case ch.Implicit:
			a.totals.ImplicitFrees++
			a.totals.ImplicitFreeBytes += f.Size
		case f.API.Info().Layer == events.LayerTensor:
			a.totals.TensorFrees++
		default:
			a.totals.Frees++
		}
		if f.API.Info().Kind != events.KindHost {
			a.nodeUse(f.Device, f.API).live -= f.Size
		}
		ps.owners.Note(a.model, f, true)
	}
	if al := ch.Alloc; al != nil {
		k := export.KeyOf(al)
		v := a.allocs[k]
		if v == nil {
			v = new([2]int64)
			a.allocs[k] = v
			ps.keys = append(ps.keys, k)
		}
		v[0]++
		v[1] += int64(al.Size)
		if al.API.Info().Layer == events.LayerTensor {
			a.totals.TensorAllocs++
		} else {
			a.totals.Allocs++
			a.totals.AllocBytes += al.Size
		}
		if al.API.Info().Kind != events.KindHost {
			u := a.nodeUse(al.Device, al.API)
			u.live += al.Size
			u.peak = max(u.peak, u.live)
		}
		ps.owners.Note(a.model, al, false)
	}
	if ch.Stack != nil && ch.Alloc == nil {
		a.totals.Failed++
		if events.IsOOM(ev.Result) {
			a.totals.OOMs++
			ps.ooms++
			ps.noteOOMFree(ev.End(), nvmlFree(a.res.NVML, ev.Device))
			a.oom(ev, ch, ps)
		}
	}
}

func (a *Agent) nodeUse(dev int32, api events.API) *nodeUse {
	k := devLevel{dev, api.Info().Layer == events.LayerTensor}
	u := a.node[k]
	if u == nil {
		u = &nodeUse{}
		a.node[k] = u
	}
	return u
}

// Tick is record.Observer's: it serves the requests queued, and ages
// processes out.
func (a *Agent) Tick(res *record.Result) {
	a.ledger = res.Ledger
	// Losses while serving only: those of the stop (res.LostStopping)
	// are the exit line's, and would tell a scraper of losses that
	// changed none of the figures it read.
	a.res.Counters, a.res.Lost, a.res.Events = res.Counters, res.Lost-res.LostStopping, res.Events
	// A sample is never changed once taken: sharing it is safe.
	a.res.NVML, a.res.NVMLTime, a.res.NVMLError = res.NVML, res.NVMLTime, res.NVMLError
	a.res.Maps, a.res.ExitsSwept, a.res.MapsFull = res.Maps, res.ExitsSwept, res.MapsFull
	for {
		select {
		case r := <-a.reqs:
			a.pending = append(a.pending, r)
			continue
		default:
		}
		break
	}
	n := 0
	for _, r := range a.pending {
		if time.Since(r.at) < settle {
			a.pending[n] = r
			n++
			continue
		}
		r.f()
		close(r.done)
	}
	clear(a.pending[n:])
	a.pending = a.pending[:n]
	if time.Since(a.lastExit) >= exitScanEvery {
		a.lastExit = time.Now()
		a.scanExits()
	}
}

// exited marks a process ended, once.
func (a *Agent) exited(ps *procState) {
	if ps.exitedAt.IsZero() {
		ps.exitedAt = time.Now()
		a.totals.ProcessesExited++
	}
}

// scanExits forgets the processes ended for longer than the retention.
// Their ends come from the session, the one owner of a process's life
// (record's life.go): its exit record, or the session's sweep for one gone
// without it (lost with a full ring buffer, or its PID reused), which ends
// it through the ledger as the record would.
func (a *Agent) scanExits() {
	now := time.Now()
	for pid, ps := range a.procs {
		if !ps.exitedAt.IsZero() && now.Sub(ps.exitedAt) >= a.opts.Retention {
			a.forget(pid)
		}
	}
}

// namesOf is the Kubernetes names of pid's container: those another
// process of the same container was given, or those of the one container
// the kubelet allocated every GPU pid uses (NVML's latest sample) to, in
// a list taken after pid was first seen (an older list may still give
// its GPU to a pod that had it before). Only a process in a pod (its
// cgroup names one) is named: a host process on a pod's GPU is not the
// pod's. Once named, a process keeps its names.
//
// The container runtime's answer (Options.Runtime, over the CRI: the
// kubelet's labels on the process's own container, by the container ID of
// its cgroup) comes first and is exact whatever the GPU sharing; the join
// by GPU is for where the runtime's socket is not reachable.
func (a *Agent) namesOf(pid uint32, ps *procState) kube.Names {
	if ps.exact || ps.container.PodUID == "" {
		return ps.names
	}
	if p, ok := a.opts.Runtime.Names(ps.container.ID); ok {
		// A pod UID that disagrees with the cgroup's is not this pod's.
		if p.UID == "" || p.UID == ps.container.PodUID {
			ps.names, ps.named, ps.exact = p.Names, true, true
			return ps.names
		}
	}
	if ps.named || a.opts.Pods == nil {
		return ps.names
	}
	if ps.container.ID != "" {
		for _, o := range a.procs {
			if o.named && o.container == ps.container {
				ps.names, ps.named, ps.exact = o.names, true, o.exact
				return ps.names
			}
		}
	}
	d := a.opts.Pods.Devices()
	if d == nil || !d.Taken.After(ps.seen) || a.res.NVML == nil {
		return kube.Names{}
	}
	var gpus []string
	for _, p := range a.res.NVML.Processes {
		if p.PID == pid && p.UUID != "" && !slices.Contains(gpus, p.UUID) {
			gpus = append(gpus, p.UUID)
		}
	}
	if n, ok := d.Owner(gpus); ok {
		ps.names, ps.named = n, true
	}
	return ps.names
}

// podNames names each running process of pids (namesOf), leaving out
// names two pods would carry at once: a pod's GPU used by another pod's
// process (one that sees every GPU) must not name the other pod.
func (a *Agent) podNames(pids []uint32) map[uint32]kube.Names {
	out := map[uint32]kube.Names{}
	uid := map[[2]string]string{} // namespace and pod -> the pod UID named so
	clash := map[[2]string]bool{}
	for _, pid := range pids {
		ps := a.procs[pid]
		if ps == nil || !ps.exitedAt.IsZero() {
			continue
		}
		n := a.namesOf(pid, ps)
		if n == (kube.Names{}) {
			continue
		}
		k := [2]string{n.Namespace, n.Pod}
		if u, ok := uid[k]; ok && u != ps.container.PodUID {
			clash[k] = true
		}
		uid[k] = ps.container.PodUID
		out[pid] = n
	}
	for pid, n := range out {
		// The runtime's names are the process's own container's: only
		// a join by GPU can give another pod's.
		if clash[[2]string{n.Namespace, n.Pod}] && !a.procs[pid].exact {
			delete(out, pid)
		}
	}
	return out
}

// forget drops everything the agent and the ledger keep of pid.
func (a *Agent) forget(pid uint32) {
	ps := a.procs[pid]
	if ps == nil {
		return
	}
	a.model.Forget(pid)
	for _, k := range ps.keys {
		delete(a.allocs, k)
		delete(a.scraped, k)
		delete(a.pushed, k)
	}
	delete(a.procs, pid)
	a.hist.forget(pid)
	a.ledger.Forget(pid)
	a.totals.ProcessesForgotten++
}

// liveStacks names copied stacks outside the reader goroutine: a
// procmodel.View of them, and the agent's symbolizer.
type liveStacks struct {
	view *procmodel.View
	syms *symbolize.Symbolizer
	done map[*ledger.Stack][]symbolize.Frame
}

// stacksFor copies what naming the stacks given needs (on the reader
// goroutine).
func (a *Agent) stacksFor(sts ...*ledger.Stack) *liveStacks {
	ls := &liveStacks{view: procmodel.NewView(), syms: a.syms, done: map[*ledger.Stack][]symbolize.Frame{}}
	for _, st := range sts {
		ls.add(a, st)
	}
	return ls
}

func (ls *liveStacks) add(a *Agent, st *ledger.Stack) { ls.view.Add(a.model, st) }

// addHistory adds the stacks a history's entries name.
func (ls *liveStacks) addHistory(a *Agent, h []export.HistoryItem) {
	for i := range h {
		ch := &h[i].Change
		if ch.Stack != nil {
			ls.add(a, ch.Stack)
		}
		for f := range ch.AllFreed() {
			ls.add(a, f.Stack)
		}
	}
}

func (ls *liveStacks) Maps(st *ledger.Stack) []proc.Mapping {
	return ls.view.CaptureOf(st).Mappings()
}

func (ls *liveStacks) Frames(st *ledger.Stack) []symbolize.Frame {
	if st == nil {
		return []symbolize.Frame{}
	}
	if f, ok := ls.done[st]; ok {
		return f
	}
	f := ls.view.Frames(ls.syms, st)
	ls.done[st] = f
	return f
}

// pids returns the PIDs of the agent's processes, sorted.
func (a *Agent) pids() []uint32 {
	out := make([]uint32, 0, len(a.procs))
	for pid := range a.procs {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// warn reports a problem the agent carries on after.
func (a *Agent) warn(format string, args ...any) {
	fmt.Fprintf(a.opts.Stderr, "cudatrace agent: warning: "+format+"\n", args...)
}
