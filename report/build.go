package report

// build.go: the report's models, built from the ledger in one place. Load,
// the summary record prints and the agent's OOM dump all take them from
// here, so a field added to Process or Failure is filled the same way for
// each.

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Frames formats symbolized frames for the report.
func Frames(fs []symbolize.Frame) []Frame {
	out := make([]Frame, 0, len(fs))
	for _, f := range fs {
		out = append(out, Frame{Function: f.Function, File: f.File, Line: f.Line, Module: f.Module,
			Address: fmt.Sprintf("%#x", f.Addr), Offset: f.Offset})
	}
	return out
}

// NewProcess is p's account as the report shows it. wall converts the
// ledger's boot times to wall time; nil leaves PeakTime out. What the
// ledger does not know (command line, container, capture error, NVML) is
// the caller's to add.
func NewProcess(p *ledger.Process, wall func(boot uint64) time.Time) Process {
	out := Process{PID: p.PID, Comm: p.Comm, Allocs: p.Allocs, Frees: p.Frees,
		Failed: p.Failed, AllocBytes: p.AllocBytes, LiveBytes: p.Live, PeakBytes: p.Peak,
		HostLiveBytes: p.HostLive, HostPeakBytes: p.HostPeak, UnknownFrees: p.UnknownFrees,
		Replaced: p.Replaced, ImplicitFrees: p.ImplicitFrees, ImplicitFreeBytes: p.ImplicitFreeBytes,
		BeforeAllocs: p.BeforeAllocs, BeforeBytes: p.BeforeBytes, LiveAllocations: p.LiveCount(), Devices: devices(p),
		TensorAllocs: p.TensorAllocs, TensorFrees: p.TensorFrees, TensorAllocBytes: p.TensorAllocBytes,
		TensorLiveBytes: p.TensorLive, TensorPeakBytes: p.TensorPeak, UnknownTensorFrees: p.UnknownTensorFrees,
		VMMMappedBytes: p.Mapped, VMMMappedPeakBytes: p.MappedPeak, VMMMaps: p.Maps, VMMUnmaps: p.Unmaps,
		VMMFailedMaps: p.FailedMaps, VMMUnknownUnmaps: p.UnknownUnmaps, VAReservedBytes: p.Reserved}
	for _, m := range p.Mappings() {
		out.VMMMappings = append(out.VMMMappings, Mapping{Addr: m.Addr, Size: m.Size, Handle: m.Handle,
			Device: m.Device, Released: m.Alloc != nil && m.Alloc.Released()})
	}
	if p.PeakTime != 0 && wall != nil {
		out.PeakTime = wall(p.PeakTime).Format(time.RFC3339Nano)
	}
	if p.Exited {
		// At its end: what it held when it ended (the ledger released it).
		out.Exited = true
		out.HeldAtExitAllocs, out.HeldAtExitBytes = p.HeldAtExitAllocs, p.HeldAtExitBytes
		out.HostHeldAtExitBytes, out.TensorHeldAtExitBytes = p.HostHeldAtExit, p.TensorHeldAtExit
		out.LiveBytes += p.HeldAtExitBytes
		out.HostLiveBytes += p.HostHeldAtExit
		out.TensorLiveBytes += p.TensorHeldAtExit
		segs, _ := p.AtEnd()
		out.LiveAllocations = len(segs)
		if wall != nil {
			out.ExitTime = wall(p.ExitTime).Format(time.RFC3339Nano)
		}
	}
	return out
}

func devices(p *ledger.Process) []Device {
	out := []Device{}
	for _, d := range p.DeviceList() {
		out = append(out, Device{Device: d.Device, Unknown: d.Unknown(), LiveBytes: d.Live, PeakBytes: d.Peak,
			TensorLiveBytes: d.TensorLive + d.TensorHeldAtExit, TensorPeakBytes: d.TensorPeak, ImplicitFrees: d.ImplicitFrees,
			ImplicitFreeBytes: d.ImplicitFreeBytes, HeldAtExitAllocs: d.HeldAtExitAllocs, HeldAtExitBytes: d.HeldAtExitBytes})
		out[len(out)-1].LiveBytes += d.HeldAtExitBytes // at its end: what it held when it ended
	}
	return out
}

// FailureContext is what a process held when one of its allocations
// failed: its GPU memory in all and on the call's device, and the stacks
// holding most of the device's.
type FailureContext struct {
	Live, DeviceLive uint64
	Stacks           []LiveShare // most bytes first
}

// ContextOf takes p's failure context as a failed call on device leaves
// it, with the n stacks holding most of the device's memory (none for 0).
// Call it at the failure: the ledger moves on.
func ContextOf(p *ledger.Process, device int32, n int) FailureContext {
	fc := FailureContext{Live: p.Live}
	if d := p.Devices[device]; d != nil {
		fc.DeviceLive = d.Live
	}
	if n > 0 {
		fc.Stacks = LiveByStack(p, func(a *ledger.Allocation) bool { return a.Device == device })
		fc.Stacks = fc.Stacks[:min(len(fc.Stacks), n)]
	}
	return fc
}

// NewFailure is failure f of process pid as the report shows it, with
// what the process held then (ctx; nil when not known). wall converts boot
// times to wall time, frames names a stack.
func NewFailure(pid uint32, f *ledger.Failure, ctx *FailureContext, wall func(boot uint64) time.Time,
	frames func(*ledger.Stack) []Frame) Failure {
	out := Failure{PID: pid, TID: f.TID, API: f.API.String(), Size: f.Size,
		Device: f.Device, Result: f.Result, Error: f.API.ResultName(f.Result),
		Time: wall(f.Time).Format(time.RFC3339Nano), Frames: frames(f.Stack)}
	if ctx != nil {
		out.LiveBytes, out.DeviceLiveBytes = ctx.Live, ctx.DeviceLive
		for _, s := range ctx.Stacks {
			out.LiveStacks = append(out.LiveStacks, StackShare{LiveBytes: s.Bytes, LiveCount: s.Count, Frames: frames(s.Stack)})
		}
	}
	return out
}

// LiveShare is one stack's share of a live set.
type LiveShare struct {
	Stack        *ledger.Stack
	Bytes, Count uint64
}

// LiveByStack sums p's live GPU allocations that keep passes by stack,
// most bytes first.
func LiveByStack(p *ledger.Process, keep func(*ledger.Allocation) bool) []LiveShare {
	by := map[*ledger.Stack]*LiveShare{}
	for _, a := range p.LiveAllocations() {
		if !a.API.Segment() || !keep(a) {
			continue
		}
		s := by[a.Stack]
		if s == nil {
			s = &LiveShare{Stack: a.Stack}
			by[a.Stack] = s
		}
		s.Bytes += a.Size
		s.Count++
	}
	out := make([]LiveShare, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b LiveShare) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(b.Count, a.Count), slices.Compare(a.Stack.Frames, b.Stack.Frames))
	})
	return out
}
