package loader

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/cudatrace/cudatrace/internal/watchdog"
)

// Two tracers on one host (an agent, and a `record` of a job beside it)
// may both stop a process at the same record: each one's BPF sends
// SIGSTOP, and one SIGCONT resumes it, whoever sends it. A reader that
// resumed the process as soon as it had read it would let it go on while
// the other reader still has to read it (its mappings, a code object the
// process may free next), and that one's frames would come out
// unresolved. So a process another tracer holds too stays stopped until
// the last holder has read it: each reader marks its entry in its own
// `held` map as read (the top bit, watchdog.Released), then looks at the
// other tracers' maps; the one that finds no other holder left sends
// SIGCONT. Every reader marks before it looks, so the last to mark sees
// every other mark and resumes the process. A reader waiting for another
// keeps its entry (read, not resumed): its watchdog still resumes the
// process after watchdog.MaxHold, should the other never read it. A
// `held` map is told by its name and shape; a tracer of an older build,
// which does not look at the others', may resume a process another holds.

// Release lets pid go after the reader has read the record BPF held it
// at, a record whose call returned at boot time end (BPF held it after):
// SIGCONT, unless another tracer holds it too and has not read it yet
// (then the last one's Release, or releaseWaiting, resumes it).
func (t *Tracer) Release(pid uint32, end uint64) error {
	if t == nil || t.objs.Held == nil {
		return nil
	}
	var at uint64
	if err := t.objs.Held.Lookup(pid, &at); err != nil {
		return nil // the watchdog resumed it first
	}
	if at&watchdog.Resumed != 0 {
		if at&^(watchdog.Released|watchdog.Resumed) >= end {
			return nil // this reader resumed it already (two threads held at once)
		}
		// Marked resumed for a hold before this record's call returned:
		// BPF's entry for this one was overwritten by resume's mark,
		// written after its SIGCONT of the previous hold (the process had
		// run on and been held again meanwhile). Nothing else would resume
		// it (the watchdog leaves entries marked resumed alone): it is
		// released as held at end, its own stamp lost, which is no later.
		t.lostHolds.Add(1)
		at = end
	}
	if err := t.objs.Held.Update(pid, at|watchdog.Released, ebpf.UpdateExist); err != nil {
		return nil // the watchdog resumed it meanwhile
	}
	if t.peers.hold(t.objs.Held, pid) {
		t.peers.waits.Add(1)
		if t.waiting == nil {
			t.waiting = map[uint32]uint64{}
		}
		t.waiting[pid] = at
		return nil
	}
	return t.resume(pid, at)
}

// resume sends pid, stopped at boot time at, SIGCONT, then marks its
// entry resumed. SIGCONT first: were the entry marked first, a tracer
// killed between the two calls would leave the process stopped with
// nothing to resume it. The entry stays (bpf/common.h): BPF holds the
// process again by overwriting it, so a record the process makes right
// after the SIGCONT is held too; an entry BPF overwrote meanwhile is left
// as it is.
func (t *Tracer) resume(pid uint32, at uint64) error {
	delete(t.waiting, pid)
	err := syscall.Kill(int(pid), syscall.SIGCONT)
	var now uint64
	if t.objs.Held.Lookup(pid, &now) == nil && now == at|watchdog.Released {
		t.objs.Held.Update(pid, at|watchdog.Released|watchdog.Resumed, ebpf.UpdateExist)
	}
	if err != nil {
		if errors.Is(err, syscall.ESRCH) {
			t.objs.Held.Delete(pid)
			return nil
		}
		return fmt.Errorf("resume pid %d after reading it: %w", pid, err)
	}
	return nil
}

// releaseWaiting resumes the processes Release left stopped for another
// tracer once no other holds them, and drops the entries of processes
// resumed that have exited. Called every poll.
func (t *Tracer) releaseWaiting() {
	if t.objs.Held == nil {
		return
	}
	for pid, at := range t.waiting {
		if !t.peers.hold(t.objs.Held, pid) {
			t.resume(pid, at)
		}
	}
	if time.Since(t.pruned) < time.Second {
		return
	}
	t.pruned = time.Now()
	var (
		pid  uint32
		at   uint64
		gone []uint32
	)
	it := t.objs.Held.Iterate()
	for it.Next(&pid, &at) {
		if at&watchdog.Resumed != 0 && syscall.Kill(int(pid), 0) == syscall.ESRCH {
			gone = append(gone, pid)
		}
	}
	for _, pid := range gone {
		t.objs.Held.Delete(pid)
	}
}

// peerHolding says whether a peer's entry at (its stop time and marks),
// looked at at boot time now, still holds the process: not read by that
// tracer, and held less than watchdog.MaxHold ago. An older one is of a
// tracer that is not reading it (stuck, or of a build that never marks
// its entries; its watchdog resumes the process): waiting on it would make
// every hold last the watchdog's MaxHold.
func peerHolding(at, now uint64) bool {
	if at&(watchdog.Released|watchdog.Resumed) != 0 {
		return false
	}
	return now < at || now-at < uint64(watchdog.MaxHold)
}

// peers finds the other tracers' held maps by walking the host's BPF maps
// (CAP_SYS_ADMIN, which tracing needs anyway). IDs are not reused soon:
// what each ID is is remembered, and a map is opened only while looked
// into, so a tracer that ended is not kept alive through its map.
type peers struct {
	kind map[ebpf.MapID]bool // true: a cudatrace held map
	// waits counts the Releases that found another tracer holding the
	// process and left it stopped for that one (Counters: peer_holds).
	waits atomic.Uint64
}

// hold says whether a tracer other than the one owning own holds pid and
// has not read it yet (its entry lacks watchdog.Released).
func (p *peers) hold(own *ebpf.Map, pid uint32) bool {
	if p.kind == nil {
		p.kind = map[ebpf.MapID]bool{}
	}
	now := watchdog.BootNow()
	ownID := ebpf.MapID(0)
	if info, err := own.Info(); err == nil {
		ownID, _ = info.ID()
	}
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if err != nil {
			return false // ENOENT: past the last one
		}
		id = next
		if id == ownID {
			continue
		}
		held, known := p.kind[id]
		if known && !held {
			continue
		}
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		if !known {
			held = isHeldMap(m)
			p.kind[id] = held
		}
		var at uint64
		holds := held && m.Lookup(pid, &at) == nil && peerHolding(at, now)
		m.Close()
		if holds {
			return true
		}
	}
}

// isHeldMap tells a cudatrace tracer's held map (bpf/common.h) by its
// name and shape.
func isHeldMap(m *ebpf.Map) bool {
	info, err := m.Info()
	return err == nil && info.Name == "held" && info.Type == ebpf.Hash && info.KeySize == 4 && info.ValueSize == 8 &&
		info.MaxEntries == 1024
}

// away tells BPF the reader is in a call that may keep it from reading for
// long (Attach): no process is held meanwhile (bpf/common.h reader_away).
func (t *Tracer) away(on bool) {
	if t.opts.Hold == HoldNone || t.objs.ReaderAway == nil {
		return
	}
	v := uint8(0)
	if on {
		v = 1
	}
	t.objs.ReaderAway.Put(uint32(0), v) // an array's only entry: cannot fail
}
