// Package top is `cudatrace top`: a live view of a tracing session. A
// Collector watches the session (record.Observer) on the reader's
// goroutine and publishes a Snapshot once per refresh; the terminal UI, or
// the plain-lines writer when stdout is not a terminal, draws snapshots on
// its own goroutine. docs/architecture.md places it among the other
// packages.
package top

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/gpustat"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
)

// Snapshot is the session at one refresh, copied out of the ledger.
type Snapshot struct {
	Seq       int           // 1 for the first snapshot
	Elapsed   time.Duration // since the collector started
	Events    uint64
	Lost      uint64
	Processes []Process // most live bytes first, then by PID
	Devices   []Device  // by number
	NVML      bool      // a NVML sample is in (NVML-USED columns mean something)
	NVMLError string    // why there is none
	// Stacks are the top stacks by live bytes of StacksPID (the selected
	// process, or the first when none is).
	StacksPID uint32
	Stacks    []Stack
}

// Process is one traced process at a refresh.
type Process struct {
	PID  uint32
	Comm string
	// Job and Rank are its place in a distributed job (its environment as
	// it started); Ranked says whether it has a rank.
	Job        string
	Rank       int
	Ranked     bool
	Live, Peak uint64 // GPU memory, as the report counts it
	LiveCount  int    // live allocations of GPU memory
	// TensorLive is the bytes of live tensors (PyTorch's blocks, inside
	// Live); 0 without tensor events.
	TensorLive uint64
	Allocs     uint64 // since tracing began (pinned host memory included)
	AllocBytes uint64
	// NVMLUsed is what the driver charges the process (all devices) at
	// the latest sample; Listed is false when NVML does not list it.
	NVMLUsed uint64
	Listed   bool
	// AllocRate and ByteRate are allocations and bytes per second since
	// the previous refresh.
	AllocRate, ByteRate float64
	// Owners are its live GPU memory by owner (package owner), most bytes
	// first.
	Owners []OwnerBytes
}

// OwnerBytes is one owner's live GPU memory in one process.
type OwnerBytes struct {
	Owner string
	Live  uint64
}

// Remainder is NVML's figure less the traced one: what tracing does not
// see. Only meaningful when Listed.
func (p *Process) Remainder() int64 { return int64(p.NVMLUsed) - int64(p.Live) }

// Device is one GPU number: the traced live bytes on that CUDA device
// ordinal, and NVML's figures for the device of that index. The two
// numberings agree unless CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER says
// otherwise.
type Device struct {
	Number     int
	Live, Peak uint64 // traced, summed over processes; Peak the highest Live reached, event by event
	NVML       *gpustat.Device
}

// Stack is one call stack's live allocations.
type Stack struct {
	PID       uint32
	Live      uint64
	LiveCount uint64
	Tensor    bool
	Frames    []uint64 // Python frames merged in (pystack.IsPython)
	// Capture is the process's capture Frames are read against: the one
	// current when the stack was first seen (procmodel.Processes.Bind).
	Capture *procmodel.Capture
	Python  pystack.Names // the names of Frames' Python frames
}

// Collector is a record.Observer that publishes snapshots.
type Collector struct {
	every time.Duration
	top   int
	only  map[uint32]bool // empty: every process
	start time.Time
	now   func() time.Time // time.Now; tests set their own clock

	// The reader goroutine's own.
	last    time.Time
	prev    map[uint32][2]uint64 // allocs, bytes at the last snapshot
	procs   *procmodel.Processes // captures, Python frames, the capture of each stack
	devPeak map[int]uint64
	// devRun is each device's traced live bytes, summed over processes,
	// kept event by event so devPeak is the true peak, not one sampled at
	// refreshes. Each refresh sets it to the ledger's figure again.
	devRun  map[int]uint64
	gpuLive map[uint32]int // live allocations of GPU memory, per process, kept by Event
	// Each process's live GPU memory by device and owner, kept by Event.
	ownerRun map[uint32]*owner.Live
	comm     map[uint32]string // of processes only NVML lists
	seq      int

	mu       sync.Mutex
	snap     *Snapshot
	selected uint32
	reselect bool          // the selection changed: its stacks are wanted now
	updated  chan struct{} // signalled (without blocking) on each snapshot
}

// NewCollector returns a Collector publishing every `every`, with top
// stacks for the selected process. pids, when not empty, are the only
// processes NVML's list adds to the traced ones.
func NewCollector(every time.Duration, top int, pids []int) *Collector {
	only := map[uint32]bool{}
	for _, p := range pids {
		only[uint32(p)] = true
	}
	return &Collector{every: every, top: top, only: only, comm: map[uint32]string{}, start: time.Now(), now: time.Now, prev: map[uint32][2]uint64{},
		procs: procmodel.New(), devPeak: map[int]uint64{}, devRun: map[int]uint64{}, gpuLive: map[uint32]int{}, updated: make(chan struct{}, 1),
		ownerRun: map[uint32]*owner.Live{}}
}

var _ record.Observer = (*Collector)(nil)

// Process keeps the process's capture for symbolizing its stacks.
func (c *Collector) Process(p *procmodel.Capture) { c.procs.Add(p) }

// Python keeps the table that names a CPython process's Python frames.
func (c *Collector) Python(pid uint32, t *pystack.Table) { c.procs.SetPython(pid, t) }

// Event binds each new stack to its process's capture, and counts each
// process's live allocations of GPU memory (what Live counts): the ledger
// would have to walk its live set for it.
func (c *Collector) Event(_ *events.Event, ch ledger.Change) {
	if ch.Process == nil {
		return
	}
	if ch.Stack != nil {
		c.procs.Bind(ch.Process.PID, ch.Stack)
	}
	// Every allocation released: a context's death and a process's end
	// release several.
	pid := ch.Process.PID
	for f := range ch.AllFreed() {
		if f.API.Segment() {
			d := int(f.Device)
			c.devRun[d] -= min(c.devRun[d], f.Size)
			c.gpuLive[pid]--
			if run := c.ownerRun[pid]; run != nil {
				run.Note(c.procs, f, true)
			}
		}
	}
	if a := ch.Alloc; a != nil && a.API.Segment() {
		c.gpuLive[ch.Process.PID]++
		d := int(a.Device)
		c.devRun[d] += a.Size
		c.devPeak[d] = max(c.devPeak[d], c.devRun[d])
		run := c.ownerRun[pid]
		if run == nil {
			run = &owner.Live{}
			c.ownerRun[pid] = run
		}
		run.Note(c.procs, a, false)
	}
}

// Flush publishes a snapshot now: the last state, once tracing stopped.
// Call it on the goroutine that ran record.Run, after it returned.
func (c *Collector) Flush(res *record.Result) { c.tick(res, true) }

// Tick publishes a snapshot when a refresh interval has passed.
func (c *Collector) Tick(res *record.Result) { c.tick(res, false) }

func (c *Collector) tick(res *record.Result, force bool) {
	now := c.now()
	c.mu.Lock()
	sel, reselect, last := c.selected, c.reselect, c.snap
	c.reselect = false
	c.mu.Unlock()
	var s *Snapshot
	switch {
	case force || c.seq == 0 || now.Sub(c.last) >= c.every:
		s = c.snapshot(res, sel, now)
	case reselect && last != nil:
		// Only the stacks: rates stay those of the last refresh interval.
		cp := *last
		cp.StacksPID, cp.Stacks = c.stacks(res.Ledger, sel, last.Processes)
		s = &cp
	default:
		return
	}
	c.mu.Lock()
	c.snap = s
	c.mu.Unlock()
	select {
	case c.updated <- struct{}{}:
	default:
	}
}

func (c *Collector) snapshot(res *record.Result, sel uint32, now time.Time) *Snapshot {
	dt := now.Sub(c.last).Seconds()
	first := c.seq == 0
	c.seq++
	c.last = now
	s := &Snapshot{Seq: c.seq, Elapsed: now.Sub(c.start), Events: res.Events, Lost: res.Lost,
		NVML: res.NVML != nil, NVMLError: res.NVMLError}
	devLive := map[int]uint64{}
	for _, p := range res.Ledger.Processes() {
		row := Process{PID: p.PID, Comm: p.Comm, Live: p.Live, Peak: p.Peak, LiveCount: c.gpuLive[p.PID], TensorLive: p.TensorLive,
			Allocs: p.Allocs, AllocBytes: p.AllocBytes}
		if pr := c.procs.Get(p.PID); pr != nil && pr.First != nil {
			row.Job = pr.First.JobID()
			if pr.First.Ranked() {
				row.Rank, row.Ranked = pr.First.Rank(), true
			}
		}
		if res.NVML != nil {
			row.NVMLUsed, row.Listed = res.NVML.Used(p.PID)
		}
		prev := c.prev[p.PID]
		if !first && dt > 0 {
			row.AllocRate = float64(p.Allocs-prev[0]) / dt
			row.ByteRate = float64(p.AllocBytes-prev[1]) / dt
		}
		c.prev[p.PID] = [2]uint64{p.Allocs, p.AllocBytes}
		if run := c.ownerRun[p.PID]; run != nil {
			byOwner := map[string]uint64{} // over its devices
			for k, n := range run.Bytes() {
				byOwner[k.Owner] += n
			}
			for o, n := range byOwner {
				row.Owners = append(row.Owners, OwnerBytes{Owner: o, Live: n})
			}
		}
		slices.SortFunc(row.Owners, func(a, b OwnerBytes) int {
			return cmp.Or(cmp.Compare(b.Live, a.Live), cmp.Compare(a.Owner, b.Owner))
		})
		for _, d := range p.Devices {
			devLive[int(d.Device)] += d.Live
		}
		s.Processes = append(s.Processes, row)
	}
	// Processes holding GPU memory that made no traced call (they
	// allocated before tracing began, or through a library not probed):
	// all of their memory is the remainder.
	if res.NVML != nil {
		seen := map[uint32]bool{}
		for _, u := range res.NVML.Processes {
			if seen[u.PID] || res.Ledger.Process(u.PID) != nil || (len(c.only) > 0 && !c.only[u.PID]) {
				continue
			}
			seen[u.PID] = true
			used, _ := res.NVML.Used(u.PID)
			s.Processes = append(s.Processes, Process{PID: u.PID, Comm: c.commOf(u.PID), NVMLUsed: used, Listed: true})
		}
	}
	slices.SortFunc(s.Processes, func(a, b Process) int {
		return cmp.Or(cmp.Compare(b.Live, a.Live), cmp.Compare(b.NVMLUsed, a.NVMLUsed), cmp.Compare(a.PID, b.PID))
	})
	nums := map[int]bool{}
	for n := range devLive {
		nums[n] = true
	}
	if res.NVML != nil {
		for _, d := range res.NVML.Devices {
			nums[d.Index] = true
		}
	}
	for n := range nums {
		c.devRun[n] = devLive[n]
		c.devPeak[n] = max(c.devPeak[n], devLive[n])
		d := Device{Number: n, Live: devLive[n], Peak: c.devPeak[n]}
		if res.NVML != nil {
			for i := range res.NVML.Devices {
				if res.NVML.Devices[i].Index == n {
					nd := res.NVML.Devices[i]
					d.NVML = &nd
				}
			}
		}
		s.Devices = append(s.Devices, d)
	}
	slices.SortFunc(s.Devices, func(a, b Device) int { return cmp.Compare(a.Number, b.Number) })

	s.StacksPID, s.Stacks = c.stacks(res.Ledger, sel, s.Processes)
	return s
}

// commOf names a process only NVML lists, once.
func (c *Collector) commOf(pid uint32) string {
	if n, ok := c.comm[pid]; ok {
		return n
	}
	n, err := proc.Comm(int(pid))
	if err != nil {
		n = "?"
	}
	c.comm[pid] = n
	return n
}

// stacks returns the top stacks by live bytes of sel, or of the first
// process when sel is not traced.
func (c *Collector) stacks(l *ledger.Ledger, sel uint32, procs []Process) (uint32, []Stack) {
	if l.Process(sel) == nil {
		if len(procs) == 0 {
			return 0, nil
		}
		sel = procs[0].PID
	}
	var out []Stack
	for _, st := range l.Stacks() {
		if len(out) >= c.top || st.Live == 0 {
			break // most live first: the rest hold nothing
		}
		if st.PID != sel {
			continue
		}
		out = append(out, Stack{PID: st.PID, Live: st.Live, LiveCount: st.LiveCount, Tensor: st.Tensor,
			Frames: slices.Clone(st.Frames), Capture: c.procs.CaptureOf(st),
			Python: c.procs.Python(st.PID).Names(nil, st.Frames)})
	}
	return sel, out
}

// Snapshot returns the latest snapshot; nil before the first.
func (c *Collector) Snapshot() *Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.snap
}

// Updated is signalled after each new snapshot.
func (c *Collector) Updated() <-chan struct{} { return c.updated }

// Select makes pid the process whose stacks the next snapshots carry.
func (c *Collector) Select(pid uint32) {
	c.mu.Lock()
	if c.selected != pid {
		c.selected, c.reselect = pid, true
	}
	c.mu.Unlock()
}
