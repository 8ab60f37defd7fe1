package agent

// owners.go: each process's live GPU memory by device and owner (its
// procState's owner.Live, kept event by event), for /metrics' owner label.

import (
	"cmp"
	"slices"

	"github.com/cudatrace/cudatrace/owner"
)

// OwnerLive is one owner's live GPU memory on one device of a process.
type OwnerLive struct {
	Device int32
	Owner  string // one of owner.Names()
	Live   uint64
}

// ownerList is l's figures by device, then most bytes first.
func ownerList(l *owner.Live) []OwnerLive {
	out := make([]OwnerLive, 0, len(l.Bytes()))
	for k, v := range l.Bytes() {
		out = append(out, OwnerLive{Device: k.Device, Owner: k.Owner, Live: v})
	}
	slices.SortFunc(out, func(a, b OwnerLive) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(b.Live, a.Live), cmp.Compare(a.Owner, b.Owner))
	})
	return out
}
