package report

// owners.go: where the GPU memory went, by owner (package owner): per
// process and device, live at the end of the trace and at the process's
// peak, and the driver's remainder beside them.

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/replay"
)

// ProcessOwners is where one process's GPU memory went.
type ProcessOwners struct {
	PID uint32 `json:"pid"`
	// End is the memory live at the end of the trace, Peak at the
	// process's peak, each per device and owner, devices in order, most
	// bytes first within one.
	End  []OwnerShare `json:"end"`
	Peak []OwnerShare `json:"peak"`
	// UntracedBytes is owner.Untraced, "context, modules and untraced":
	// the driver's figure (NVML) less what was traced, at its last sample
	// of the process, over all its GPUs (NVML's device numbers are not
	// CUDA's); absent without NVML samples.
	UntracedBytes *int64 `json:"untraced_bytes,omitempty"`
}

// OwnerShare is one owner's GPU memory on one device.
type OwnerShare struct {
	Device  int32  `json:"device"`
	Unknown bool   `json:"unknown,omitempty"` // Device is events.DeviceUnknown
	Owner   string `json:"owner"`
	// Module, for the application, is the file of the innermost frame
	// outside CUDA's own libraries (one row per module).
	Module    string `json:"module,omitempty"`
	LiveBytes uint64 `json:"live_bytes"`
	LiveCount uint64 `json:"live_count"`
}

// liveAt is one live GPU allocation of a moment past (the peak), its stack
// the first pass's.
type liveAt struct {
	Stack  *ledger.Stack
	Device int32
	Size   uint64
	Count  uint64 // allocations of Size bytes in all; 0 is one
}

// OwnerLive is GPU memory a live view holds: Count allocations of Bytes in
// all, made from Stack on Device.
type OwnerLive struct {
	Stack        *ledger.Stack
	Device       int32
	Bytes, Count uint64
}

// LiveOwners is where process pid's GPU memory went, as a live view (the
// agent's page) holds it: end, what it holds now, and peak, its live set
// at its peak; ownerOf names each stack's owner.
func LiveOwners(pid uint32, end, peak []OwnerLive, ownerOf func(*ledger.Stack) owner.Owner) ProcessOwners {
	at := func(rows []OwnerLive) func(int) liveAt {
		return func(i int) liveAt {
			r := rows[i]
			return liveAt{Stack: r.Stack, Device: r.Device, Size: r.Bytes, Count: r.Count}
		}
	}
	return ProcessOwners{PID: pid, End: shares(len(end), at(end), ownerOf), Peak: shares(len(peak), at(peak), ownerOf)}
}

// owners caches the owner of each stack of one trace.
type owners struct {
	t  *replay.Trace
	of map[*ledger.Stack]owner.Owner
}

func (o *owners) owner(st *ledger.Stack) owner.Owner {
	if w, ok := o.of[st]; ok {
		return w
	}
	w := owner.OfStack(o.t.Procs.CaptureOf(st), o.t.Procs.Python(st.PID), st.Frames)
	o.of[st] = w
	return w
}

// ownerKey is a row of ProcessOwners: the module is kept for the
// application only, so that cuBLAS's two libraries are one owner.
func ownerKey(w owner.Owner) owner.Owner {
	if w.Name != owner.Application {
		w.Module = ""
	}
	return w
}

type shareKey struct {
	device int32
	owner  owner.Owner
}

// shares sums live allocations by device and owner.
func shares(n int, at func(i int) liveAt, ownerOf func(*ledger.Stack) owner.Owner) []OwnerShare {
	by := map[shareKey]*OwnerShare{}
	for i := range n {
		a := at(i)
		k := shareKey{a.Device, ownerKey(ownerOf(a.Stack))}
		s := by[k]
		if s == nil {
			s = &OwnerShare{Device: a.Device, Unknown: a.Device < 0, Owner: k.owner.Name, Module: k.owner.Module}
			by[k] = s
		}
		s.LiveBytes += a.Size
		s.LiveCount += max(a.Count, 1)
	}
	out := make([]OwnerShare, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b OwnerShare) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(b.LiveBytes, a.LiveBytes),
			cmp.Compare(a.Owner, b.Owner), cmp.Compare(a.Module, b.Module))
	})
	return out
}

// buildOwners is where each selected process's GPU memory went, at the end
// (t's ledger) and at its peak (peak: its live set then).
func buildOwners(t *replay.Trace, procs []Process, peak map[uint32][]liveAt) []ProcessOwners {
	o := &owners{t: t, of: map[*ledger.Stack]owner.Owner{}}
	out := []ProcessOwners{}
	for _, rp := range procs {
		p := t.Ledger.Process(rp.PID)
		if p == nil {
			continue
		}
		var end []liveAt
		segs, _ := p.AtEnd() // an ended process's: what it held at exit
		for _, a := range segs {
			if a.API.Segment() {
				end = append(end, liveAt{Stack: a.Stack, Device: a.Device, Size: a.Size})
			}
		}
		pk := peak[rp.PID]
		po := ProcessOwners{PID: rp.PID,
			End:  shares(len(end), func(i int) liveAt { return end[i] }, o.owner),
			Peak: shares(len(pk), func(i int) liveAt { return pk[i] }, o.owner)}
		if rp.NVML != nil && rp.NVML.Samples > 0 {
			r := rp.NVML.RemainderBytes
			po.UntracedBytes = &r
		}
		out = append(out, po)
	}
	return out
}

// OwnerBytes sums rows by owner (every device, every application module).
func OwnerBytes(rows []OwnerShare) map[string]uint64 {
	out := map[string]uint64{}
	for _, s := range rows {
		out[s.Owner] += s.LiveBytes
	}
	return out
}

func (r *Report) writeOwners(w io.Writer, comm map[uint32]string) {
	if len(r.Owners) == 0 {
		return
	}
	fmt.Fprintf(w, "\nWhere the GPU memory went, by owner (the component whose frame is innermost in the allocating stack):\n\n")
	t := &table{right: []bool{true, false, false, false, true, true, true}}
	t.add("PID", "COMM", "GPU", "OWNER", "AT END", "ALLOCS", "AT PEAK")
	for _, po := range r.Owners {
		type row struct {
			end, peak *OwnerShare
		}
		rows := map[shareKey]*row{}
		var order []shareKey
		add := func(s *OwnerShare, atPeak bool) {
			k := shareKey{s.Device, owner.Owner{Name: s.Owner, Module: s.Module}}
			r := rows[k]
			if r == nil {
				r = &row{}
				rows[k] = r
				order = append(order, k)
			}
			if atPeak {
				r.peak = s
			} else {
				r.end = s
			}
		}
		for i := range po.End {
			add(&po.End[i], false)
		}
		for i := range po.Peak {
			add(&po.Peak[i], true)
		}
		slices.SortStableFunc(order, func(a, b shareKey) int { return cmp.Compare(a.device, b.device) })
		for _, k := range order {
			r := rows[k]
			name := k.owner.Name
			if k.owner.Module != "" {
				name += " (" + k.owner.Module + ")"
			}
			end, count, peak := "0 B", "0", "0 B"
			if r.end != nil {
				end, count = units.Bytes(r.end.LiveBytes), fmt.Sprint(r.end.LiveCount)
			}
			if r.peak != nil {
				peak = units.Bytes(r.peak.LiveBytes)
			}
			t.add(fmt.Sprint(po.PID), comm[po.PID], events.DeviceName(k.device), name, end, count, peak)
		}
		if po.UntracedBytes != nil {
			u := signed(*po.UntracedBytes) // negative where NVML lagged behind the trace
			t.add(fmt.Sprint(po.PID), comm[po.PID], "all", owner.Untraced, strings.TrimPrefix(u, "+"), "", "")
		}
	}
	_ = t.write(w)
}
