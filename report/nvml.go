package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The cross-check with the driver: at each NVML sample in the trace, the
// memory the driver charges a process (summed over its devices: NVML's
// device indices are not CUDA's ordinals) beside the live bytes cudatrace
// traced for it at that point. The remainder, NVML's minus the traced, is
// what tracing did not see: the CUDA context, library workspaces, memory
// from an API that is not probed. Its drift over the samples tells a
// constant overhead from a growing one.

// NVMLSummary is what the trace's NVML samples say beyond each process's.
type NVMLSummary struct {
	Samples int `json:"samples"` // samples taken
	Failed  int `json:"failed"`  // samples that could not be taken
	// Error says why there are none (NVML unavailable while recording),
	// or what the first failed sample said.
	Error string `json:"error,omitempty"`
	// Devices are the GPUs at the last sample, by index.
	Devices []GPU `json:"devices"`
	// Untraced, in a trace of every process (--all), are the processes
	// NVML charged memory to that made no traced call: a program whose
	// CUDA library was not probed.
	Untraced []NVMLUse `json:"untraced,omitempty"`
	// Intervals, with --interval, are the remainder per process and
	// interval.
	Intervals []NVMLInterval `json:"intervals,omitempty"`
}

// GPU is one device as NVML saw it.
type GPU struct {
	Index        int    `json:"index"`
	UUID         string `json:"uuid"`
	Name         string `json:"name"`
	TotalBytes   uint64 `json:"total_bytes"`
	UsedBytes    uint64 `json:"used_bytes"` // at the last sample
	FreeBytes    uint64 `json:"free_bytes"`
	MaxUsedBytes uint64 `json:"max_used_bytes"` // the highest of all samples
}

// NVMLUse is the memory NVML charged a process at its last sample listing it.
type NVMLUse struct {
	PID       uint32 `json:"pid"`
	Device    int    `json:"device,omitempty"` // NVML's index; in Process.NVML.Devices only
	UUID      string `json:"uuid,omitempty"`
	UsedBytes uint64 `json:"used_bytes"`
}

// ProcessNVML is one process's cross-check.
type ProcessNVML struct {
	// Samples is how many samples listed the process; 0 when NVML never
	// did (it had no CUDA context, or ran on a stand-in), and the fields
	// below are then 0.
	Samples        int    `json:"samples"`
	UsedBytes      uint64 `json:"used_bytes"`      // NVML's figure at the last of them
	TracedBytes    uint64 `json:"traced_bytes"`    // traced live GPU bytes then
	RemainderBytes int64  `json:"remainder_bytes"` // UsedBytes - TracedBytes
	LastNS         uint64 `json:"last_ns"`         // since the start of the recording
	// The remainder over the samples: at the first, the least and the most.
	FirstRemainderBytes int64  `json:"first_remainder_bytes"`
	FirstNS             uint64 `json:"first_ns"`
	MinRemainderBytes   int64  `json:"min_remainder_bytes"`
	MaxRemainderBytes   int64  `json:"max_remainder_bytes"`
	// DriftBytes is the last remainder less the first: how much more
	// untraced memory the process held by the end.
	DriftBytes   int64     `json:"drift_bytes"`
	MaxUsedBytes uint64    `json:"max_used_bytes"`
	Devices      []NVMLUse `json:"devices"` // at the last sample, by NVML index
	// HeldBeforeBytes, for a process that was running when tracing began
	// (record --pid, --all), is the driver's figure for what it held
	// then: its first sample's remainder, NVML's figure less what was
	// traced by then (its context's own memory included, as NVML counts
	// it). 0 for a process started under the tracer.
	HeldBeforeBytes int64 `json:"held_before_bytes,omitempty"`
}

// runningBefore reports whether a process that started at start (boot ns,
// rounded down to a tick) was running when the trace began: never one of
// a launched command's (they all start after it), nor one that started
// within a tick of the trace's start, which the rounding hides.
func runningBefore(meta *tracefile.Meta, start uint64) bool {
	return len(meta.Command) == 0 && start != 0 && start+uint64(proc.StartTimeTick) <= meta.StartBoot
}

// NVMLInterval is one process's remainder over one interval: its last
// sample in it, and the least and most remainder of its samples.
type NVMLInterval struct {
	PID               uint32 `json:"pid"`
	StartNS           uint64 `json:"start_ns"`
	EndNS             uint64 `json:"end_ns"`
	Samples           int    `json:"samples"`
	UsedBytes         uint64 `json:"used_bytes"`
	TracedBytes       uint64 `json:"traced_bytes"`
	RemainderBytes    int64  `json:"remainder_bytes"`
	MinRemainderBytes int64  `json:"min_remainder_bytes"`
	MaxRemainderBytes int64  `json:"max_remainder_bytes"`
}

// nvmlFollower accumulates the samples as the trace is replayed.
type nvmlFollower struct {
	start, interval uint64
	frames          int // nvml frames, failed ones included
	samples, failed int
	err             string
	devices         map[int]*GPU
	procs           map[uint32]*ProcessNVML
	intervals       map[nvmlIntervalKey]*NVMLInterval
	overflowed      bool
}

type nvmlIntervalKey struct {
	pid uint32
	k   uint64
}

func newNVMLFollower(start uint64, interval time.Duration) *nvmlFollower {
	return &nvmlFollower{start: start, interval: uint64(interval), devices: map[int]*GPU{},
		procs: map[uint32]*ProcessNVML{}, intervals: map[nvmlIntervalKey]*NVMLInterval{}}
}

func (f *nvmlFollower) since(t uint64) uint64 {
	if t <= f.start {
		return 0
	}
	return t - f.start
}

func (f *nvmlFollower) onNVML(n *tracefile.NVML, l *ledger.Ledger) error {
	f.frames++
	if n.Error != "" {
		f.failed++
		if f.err == "" {
			f.err = n.Error
		}
		return nil
	}
	f.samples++
	for _, d := range n.Devices {
		g := f.devices[d.Index]
		if g == nil {
			g = &GPU{}
			f.devices[d.Index] = g
		}
		peak := max(g.MaxUsedBytes, d.Used)
		*g = GPU{Index: d.Index, UUID: d.UUID, Name: d.Name, TotalBytes: d.Total, UsedBytes: d.Used,
			FreeBytes: d.Free, MaxUsedBytes: peak}
	}
	used := map[uint32]uint64{}
	perDevice := map[uint32][]NVMLUse{}
	for _, p := range n.Processes {
		used[p.PID] += p.Used
		perDevice[p.PID] = append(perDevice[p.PID], NVMLUse{PID: p.PID, Device: p.Device, UUID: p.UUID, UsedBytes: p.Used})
	}
	at := f.since(n.Time)
	for pid, u := range used {
		var traced uint64
		if p := l.Process(pid); p != nil {
			if p.Exited && p.ExitTime <= n.Time {
				// The driver lists a process for a while after it ends,
				// charged what it is freeing; nothing is live to set
				// beside it.
				continue
			}
			traced = p.Live
		}
		rem := int64(u) - int64(traced)
		pn := f.procs[pid]
		if pn == nil {
			pn = &ProcessNVML{FirstRemainderBytes: rem, FirstNS: at, MinRemainderBytes: rem, MaxRemainderBytes: rem}
			f.procs[pid] = pn
		}
		pn.Samples++
		pn.UsedBytes, pn.TracedBytes, pn.RemainderBytes, pn.LastNS = u, traced, rem, at
		pn.MinRemainderBytes = min(pn.MinRemainderBytes, rem)
		pn.MaxRemainderBytes = max(pn.MaxRemainderBytes, rem)
		pn.DriftBytes = rem - pn.FirstRemainderBytes
		pn.MaxUsedBytes = max(pn.MaxUsedBytes, u)
		pn.Devices = perDevice[pid]
		if f.interval == 0 {
			continue
		}
		key := nvmlIntervalKey{pid, at / f.interval}
		iv := f.intervals[key]
		if iv == nil {
			if len(f.intervals) >= maxIntervals {
				f.overflowed = true
				continue
			}
			iv = &NVMLInterval{PID: pid, StartNS: key.k * f.interval, EndNS: (key.k + 1) * f.interval,
				MinRemainderBytes: rem, MaxRemainderBytes: rem}
			f.intervals[key] = iv
		}
		iv.Samples++
		iv.UsedBytes, iv.TracedBytes, iv.RemainderBytes = u, traced, rem
		iv.MinRemainderBytes = min(iv.MinRemainderBytes, rem)
		iv.MaxRemainderBytes = max(iv.MaxRemainderBytes, rem)
	}
	return nil
}

// summary returns nil for a trace without nvml frames (recorded with
// --nvml=false, or by a cudatrace before them).
func (f *nvmlFollower) summary(untraced bool, traced, selected func(uint32) bool) *NVMLSummary {
	if f.frames == 0 {
		return nil
	}
	s := &NVMLSummary{Samples: f.samples, Failed: f.failed, Error: f.err, Devices: []GPU{}}
	for _, g := range f.devices {
		s.Devices = append(s.Devices, *g)
	}
	slices.SortFunc(s.Devices, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
	if untraced {
		for pid, pn := range f.procs {
			if !traced(pid) {
				s.Untraced = append(s.Untraced, NVMLUse{PID: pid, UsedBytes: pn.UsedBytes})
			}
		}
		slices.SortFunc(s.Untraced, func(a, b NVMLUse) int { return cmp.Compare(a.PID, b.PID) })
	}
	for _, iv := range f.intervals {
		if traced(iv.PID) && selected(iv.PID) {
			s.Intervals = append(s.Intervals, *iv)
		}
	}
	slices.SortFunc(s.Intervals, func(a, b NVMLInterval) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.StartNS, b.StartNS))
	})
	return s
}

// process returns pid's cross-check: nil without samples, zero when no
// sample listed it.
func (f *nvmlFollower) process(pid uint32) *ProcessNVML {
	if f.samples == 0 {
		return nil
	}
	if pn := f.procs[pid]; pn != nil {
		out := *pn
		return &out
	}
	return &ProcessNVML{Devices: []NVMLUse{}}
}

// writeNVML prints the cross-check: the GPUs, then per process NVML's
// figure beside the traced one.
func (r *Report) writeNVML(w io.Writer, comm map[uint32]string) {
	n := r.NVML
	if n == nil {
		return
	}
	if n.Samples == 0 {
		fmt.Fprintf(w, "\nDriver's view (NVML): none while recording: %s\n", n.Error)
		return
	}
	failed := ""
	if n.Failed > 0 {
		failed = fmt.Sprintf("; %d failed, the first: %s", n.Failed, n.Error)
	}
	fmt.Fprintf(w, "\nDriver's view (NVML, %s%s):\n\n", plural(uint64(n.Samples), "sample"), failed)
	t := table{right: []bool{true, false, true, true, true, true, false}}
	t.add("GPU", "NAME", "TOTAL", "USED", "FREE", "MAX-USED", "UUID")
	for _, g := range n.Devices {
		t.add(fmt.Sprint(g.Index), g.Name, units.Bytes(g.TotalBytes), units.Bytes(g.UsedBytes), units.Bytes(g.FreeBytes),
			units.Bytes(g.MaxUsedBytes), g.UUID)
	}
	t.write(w)
	fmt.Fprintln(w, "\nNVML-USED is what the driver charged the process at its last sample, TRACED what cudatrace")
	fmt.Fprintln(w, "saw live then; REMAINDER (NVML-USED - TRACED) is what tracing did not see: the CUDA context,")
	fmt.Fprintln(w, "library workspaces, allocations through an API that is not probed. DRIFT: its change since")
	fmt.Fprintln(w, "the first sample.")
	fmt.Fprintln(w)
	t = table{right: []bool{true, false, true, true, true, true, true, true, true}}
	t.add("PID", "COMM", "NVML-USED", "TRACED", "REMAINDER", "FIRST", "MIN", "MAX", "DRIFT")
	for _, p := range r.Processes {
		pn := p.NVML
		if pn == nil || pn.Samples == 0 {
			t.add(fmt.Sprint(p.PID), p.Comm, "not listed", "", "", "", "", "", "")
			continue
		}
		t.add(fmt.Sprint(p.PID), p.Comm, units.Bytes(pn.UsedBytes), units.Bytes(pn.TracedBytes),
			units.SignedBytes(pn.RemainderBytes), units.SignedBytes(pn.FirstRemainderBytes), units.SignedBytes(pn.MinRemainderBytes),
			units.SignedBytes(pn.MaxRemainderBytes), units.SignedBytes(pn.DriftBytes))
	}
	t.write(w)
	for _, p := range r.Processes {
		if p.NVML != nil && p.NVML.HeldBeforeBytes != 0 {
			fmt.Fprintf(w, "Before tracing: pid %d held %s of GPU memory when tracing began (NVML's first figure less what was traced by then)\n",
				p.PID, units.SignedBytes(p.NVML.HeldBeforeBytes))
		}
	}
	for _, u := range n.Untraced {
		fmt.Fprintf(w, "Not traced: pid %d held %s of GPU memory (NVML) and made no traced call: is its CUDA library probed? (--lib)\n",
			u.PID, units.Bytes(u.UsedBytes))
	}
	if len(n.Intervals) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRemainder per %s (the last sample in each interval):\n\n", time.Duration(r.IntervalNS))
	t = table{right: []bool{true, false, true, true, true, true, true, true, true}}
	t.add("PID", "COMM", "FROM", "SAMPLES", "NVML-USED", "TRACED", "REMAINDER", "MIN", "MAX")
	for _, iv := range n.Intervals {
		t.add(fmt.Sprint(iv.PID), comm[iv.PID], time.Duration(iv.StartNS).String(), fmt.Sprint(iv.Samples),
			units.Bytes(iv.UsedBytes), units.Bytes(iv.TracedBytes), units.SignedBytes(iv.RemainderBytes),
			units.SignedBytes(iv.MinRemainderBytes), units.SignedBytes(iv.MaxRemainderBytes))
	}
	t.write(w)
}
