package record

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"sync"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
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
	named   []tracefile.Symbol
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
	p    symbolize.Proc
	maps []proc.Mapping
	pcs  []uint64
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

		out := Names(sym, job.p, job.maps, job.pcs)
		n.mu.Lock()
		n.named = append(n.named, out...)
		n.mu.Unlock()
	}
}

// Names names return addresses pcs of process p, whose mappings are maps,
// for a trace's symbols frames: each one sym names,
// keyed by its file's build ID and file offset, which replay matches when
// no file here holds that build (the process ran in a container, or on
// another machine). Addresses in files without a build ID are left out:
// nothing would tie the name to the file.
func Names(sym *symbolize.Symbolizer, p symbolize.Proc, maps []proc.Mapping, pcs []uint64) []tracefile.Symbol {
	if !slices.IsSortedFunc(maps, func(a, b proc.Mapping) int { return cmp.Compare(a.Start, b.Start) }) {
		maps = slices.SortedFunc(slices.Values(maps), func(a, b proc.Mapping) int { return cmp.Compare(a.Start, b.Start) })
	}
	var out []tracefile.Symbol
	for i, f := range sym.FramesOf(p, maps, pcs) {
		m := mappingOf(maps, pcs[i])
		if m == nil || m.BuildID == "" || f.Function == "" && f.File == "" {
			continue
		}
		out = append(out, tracefile.Symbol{BuildID: m.BuildID, Offset: pcs[i] - m.Start + m.Offset,
			VAddr: f.Offset, Function: f.Function, File: f.File, Line: f.Line})
	}
	return out
}

// take returns the names found since the last call.
func (n *namer) take() []tracefile.Symbol {
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

// mappingOf returns the mapping of maps (sorted by address) holding pc.
func mappingOf(maps []proc.Mapping, pc uint64) *proc.Mapping {
	if i := proc.Find(maps, pc); i >= 0 {
		return &maps[i]
	}
	return nil
}

// nameNative queues the return addresses of ev's stack not named before,
// while its files are at hand: for a process with its own root, and, with
// Options.Portable, for every process.
func (s *session) nameNative(ev *events.Event, ps *procState) {
	if ps.root == "" && !s.opts.Portable || s.w == nil || len(ev.Stack) == 0 {
		return
	}
	if s.namer == nil {
		s.namer = newNamer()
	}
	// Per process and capture: the same addresses in another process, or
	// after an exec, may lie in other files.
	b := binary.LittleEndian.AppendUint32(s.namer.buf[:0], ev.PID)
	b = binary.LittleEndian.AppendUint64(b, ps.start)
	b = binary.LittleEndian.AppendUint64(b, uint64(ps.captured.UnixNano()))
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
	job := nameJob{p: symbolize.Proc{PID: int(ev.PID), Start: ps.start, OwnRoot: ps.root != ""}, maps: ps.maps}
	for _, pc := range ev.Stack {
		m := mappingOf(ps.maps, pc)
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
