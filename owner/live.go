package owner

import (
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
)

// DeviceOwner keys Live's figures: a device and an owner's name.
type DeviceOwner struct {
	Device int32
	Owner  string // one of Names()
}

// Live is one process's live GPU memory by device and owner, kept event
// by event by the live views (top, the agent) on the reader's goroutine.
// Each stack's owner is named once (OfStack), from the capture the process
// model bound it to. The zero value is ready to use.
type Live struct {
	bytes map[DeviceOwner]uint64
	of    map[*ledger.Stack]string
}

// Note counts the GPU memory al holds against its stack's owner: added
// when allocated, taken off when freed. Pinned host memory and tensors
// are not counted (segments only, as live_bytes{level="segment"}).
func (l *Live) Note(m *procmodel.Processes, al *ledger.Allocation, freed bool) {
	if !al.API.Segment() {
		return
	}
	if l.bytes == nil {
		l.bytes, l.of = map[DeviceOwner]uint64{}, map[*ledger.Stack]string{}
	}
	name := Application
	if st := al.Stack; st != nil {
		var ok bool
		if name, ok = l.of[st]; !ok {
			name = OfStack(m.CaptureOf(st), m.Python(st.PID), st.Frames).Name
			l.of[st] = name
		}
	}
	k := DeviceOwner{al.Device, name}
	if freed {
		l.bytes[k] -= min(l.bytes[k], al.Size)
		if l.bytes[k] == 0 {
			delete(l.bytes, k)
		}
		return
	}
	l.bytes[k] += al.Size
}

// Bytes is what each device and owner holds now (none at 0); the map is
// l's own: read it, do not keep it past the next Note.
func (l *Live) Bytes() map[DeviceOwner]uint64 { return l.bytes }
