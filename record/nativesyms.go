package record

import (
	"encoding/binary"
	"hash/maphash"
	"sync"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
)

// namer names, while they run, the native return addresses of processes
// with their own root (containers), or of every process with
// Options.Portable, into the trace (symbols frames): once such a process
// is gone, the host reading the trace may hold other builds of its files,
// or none (another machine). Each (build ID, file offset) is named once. The
// files are parsed on a goroutine of its own, so that a large library does
// not hold up the ring buffer's reader; the names go to the trace at the
// next tick.
type namer struct {
	// On the session's goroutine: the addresses named, and the stacks
	// (by hash) all of whose addresses were, so that a stack seen before
	// costs one lookup.
	seen   map[namedKey]bool
	stacks map[uint64]bool
	seed   maphash.Seed
	buf    []byte

	mu      sync.Mutex
	queue   []nameJob
	named   []procmodel.Symbol
	stopped bool
	wake    chan struct{}
	done    chan struct{}
}

// maxNamedStacks bounds the stacks remembered as named.
const maxNamedStacks = 1 << 18

type namedKey struct {
	buildID string
	off     uint64
}

type nameJob struct {
	c   *procmodel.Capture
	pcs []uint64
}

func newNamer() *namer {
	n := &namer{seen: map[namedKey]bool{}, stacks: map[uint64]bool{}, seed: maphash.MakeSeed(), wake: make(chan struct{}, 1), done: make(chan struct{})}
	go n.run()
	return n
}

func (n *namer) run() {
	defer close(n.done)
	sym := symbolize.New()
	defer sym.Close()
	for {
		n.mu.Lock()
		for len(n.queue) == 0 && !n.stopped {
			n.mu.Unlock()
			<-n.wake
			n.mu.Lock()
		}
		if len(n.queue) == 0 {
			n.mu.Unlock()
			return
		}
		job := n.queue[0]
		n.queue = n.queue[1:]
		n.mu.Unlock()

		out := procmodel.Names(sym, job.c, job.pcs)
		n.mu.Lock()
		n.named = append(n.named, out...)
		n.mu.Unlock()
	}
}

// take returns the names found since the last call.
func (n *namer) take() []procmodel.Symbol {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.named
	n.named = nil
	return out
}

// stop waits for the addresses queued to be named.
func (n *namer) stop() {
	n.mu.Lock()
	n.stopped = true
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
	<-n.done
}

// nameNative queues the return addresses of ev's stack not named before,
// while its files are at hand: for a process with its own root, and, with
// Options.Portable, for every process.
func (s *session) nameNative(ev *events.Event, lp *liveProc) {
	c := lp.p.Current()
	if c == nil || !c.OwnRoot && !s.opts.Portable || s.opts.NoSymbolize || s.w == nil || len(ev.Stack) == 0 {
		return
	}
	if s.namer == nil {
		s.namer = newNamer()
	}
	// Per process and capture: the same addresses in another process, or
	// after an exec, may lie in other files.
	b := binary.LittleEndian.AppendUint32(s.namer.buf[:0], ev.PID)
	b = binary.LittleEndian.AppendUint64(b, c.Start)
	b = binary.LittleEndian.AppendUint64(b, c.Time)
	for _, pc := range ev.Stack {
		b = binary.LittleEndian.AppendUint64(b, pc)
	}
	s.namer.buf = b
	h := maphash.Bytes(s.namer.seed, b)
	if s.namer.stacks[h] {
		return
	}
	if len(s.namer.stacks) >= maxNamedStacks {
		// Processes come and go under --all: start over rather than grow
		// without end; seen addresses still cost a lookup each, not a
		// parse.
		clear(s.namer.stacks)
	}
	s.namer.stacks[h] = true
	job := nameJob{c: c}
	for _, pc := range ev.Stack {
		m := procmodel.MappingOf(c.Maps, pc)
		if m == nil || m.BuildID == "" {
			continue // without a build ID nothing ties a name to the file
		}
		k := namedKey{m.BuildID, pc - m.Start + m.Offset}
		if s.namer.seen[k] {
			continue
		}
		s.namer.seen[k] = true
		job.pcs = append(job.pcs, pc)
	}
	if len(job.pcs) == 0 {
		return
	}
	s.namer.mu.Lock()
	s.namer.queue = append(s.namer.queue, job)
	s.namer.mu.Unlock()
	select {
	case s.namer.wake <- struct{}{}:
	default:
	}
}

// writeNamed writes the names found so far to the trace; with final, it
// first waits for those still queued.
func (s *session) writeNamed(final bool) {
	if s.namer == nil {
		return
	}
	if final {
		s.namer.stop()
	}
	named := s.namer.take()
	if final {
		s.namer = nil
	}
	if len(named) == 0 || s.w == nil {
		return
	}
	if err := s.w.WriteNames(named); err != nil {
		s.warn(err)
	}
}
