package agent

// owners.go: each process's live GPU memory by device and owner (package
// owner), kept event by event for /metrics' owner label.

import (
	"cmp"
	"slices"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
)

// OwnerLive is one owner's live GPU memory on one device of a process.
type OwnerLive struct {
	Device int32
	Owner  string // one of owner.Names()
	Live   uint64
}

type ownerKey struct {
	device int32
	owner  string
}

// ownerUse is a process's live GPU memory by device and owner, and its
// stacks' owners, each named once: both go with the process's procState.
type ownerUse struct {
	live map[ownerKey]uint64
	of   map[*ledger.Stack]string
}

// noteOwner counts GPU memory a allocated (freed: released) against its
// stack's owner.
func (a *Agent) noteOwner(ps *procState, al *ledger.Allocation, freed bool) {
	if !al.API.Segment() {
		return // GPU memory only, as live_bytes{level="segment"} counts it
	}
	u := &ps.owners
	if u.live == nil {
		u.live, u.of = map[ownerKey]uint64{}, map[*ledger.Stack]string{}
	}
	name := owner.Application
	if st := al.Stack; st != nil {
		var ok bool
		if name, ok = u.of[st]; !ok {
			name = owner.OfStack(a.model.CaptureOf(st), a.model.Python(st.PID), st.Frames).Name
			u.of[st] = name
		}
	}
	k := ownerKey{al.Device, name}
	if freed {
		u.live[k] -= min(u.live[k], al.Size)
		if u.live[k] == 0 {
			delete(u.live, k)
		}
		return
	}
	u.live[k] += al.Size
}

// list is u's figures by device, then most bytes first.
func (u *ownerUse) list() []OwnerLive {
	out := make([]OwnerLive, 0, len(u.live))
	for k, v := range u.live {
		out = append(out, OwnerLive{Device: k.device, Owner: k.owner, Live: v})
	}
	slices.SortFunc(out, func(a, b OwnerLive) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(b.Live, a.Live), cmp.Compare(a.Owner, b.Owner))
	})
	return out
}
