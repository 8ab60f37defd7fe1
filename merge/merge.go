// Package merge puts the traces of one job's nodes into one trace file
// (cudatrace merge), which report, export and replay read with the code
// that reads any trace: one timeline, one ledger, every process once.
//
// What it takes to make several hosts' traces one:
//
//   - One clock. Every time in a trace is its host's CLOCK_BOOTTIME, which
//     no two hosts share; each trace's meta pairs it with the wall clock
//     at its start. The merged clock is the wall clock less a constant: a
//     node's time t becomes t + its offset, the offset chosen so that its
//     start lands at its wall-clock start (relative to the earliest), and
//     so that no time of any node falls below 0. How well that aligns two
//     nodes is how well their wall clocks agreed (NTP, PTP): each node's
//     pair width and synchronization go into the merged meta (Nodes), for
//     the report to say.
//   - One PID space. The ledger, the process model and every output key a
//     process by its PID, and two nodes have the same PIDs. A process keeps
//     its PID unless a process of another node seen before it in time had
//     that PID; then it gets the next number above the kernel's PID limit
//     (2^22), which no host's process has, and its process frame keeps the
//     PID it had (node_pid). The order of the traces given does not change
//     the numbers.
//   - Every process its node: the process frames carry the host's name
//     (node), and the replay names their stacks from the files of their
//     build IDs and the symbols frames, never from this host's /proc.
//   - One order. Frames go out by time across traces (a k-way merge; each
//     trace's own order is kept, so a process frame still precedes its
//     events), counters as the sums of each trace's latest, one end frame
//     saying how each trace ended (a truncated one is merged up to its
//     damage, and said).
//
// The NVML samples keep their processes' figures; their devices are left
// out: NVML numbers each host's GPUs from 0, and a merged device 0 would be
// several GPUs.
package merge

import (
	"cmp"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/tracefile"
)

// FirstRenumbered is the first PID the merge gives a process whose PID a
// node merged before it had: above the kernel's PID_MAX_LIMIT (2^22), so
// no process of any host has it.
const FirstRenumbered = 1<<22 + 1

// Input is one trace to merge: its path, and how to name it (the URL it
// was fetched from; the path when empty).
type Input struct {
	Path, Name string
}

func (in Input) name() string { return cmp.Or(in.Name, in.Path) }

// Result says what a merge did.
type Result struct {
	Nodes  []tracefile.Node
	Ends   []tracefile.NodeEnd
	Events uint64
	// Renumbered counts the processes given a PID of their own.
	Renumbered int
	// Warnings are what the merged trace's reader should know: a trace
	// cut short, the same process in two traces.
	Warnings []string
}

// Write merges the traces of ins into one trace written to w; tool names
// the writer in the meta ("cudatrace v1.2"). A trace that is not one (or
// of a later version) fails the merge; one cut short or damaged is merged
// up to where it stops making sense, and said.
func Write(w io.Writer, ins []Input, tool string) (*Result, error) {
	if len(ins) == 0 {
		return nil, errors.New("no trace to merge")
	}
	m := &merger{res: &Result{}, used: map[uint32]bool{}, next: FirstRenumbered,
		libs: map[string]bool{}, procs: map[procKey]int{}}
	defer m.close()
	type start struct {
		host       string
		boot, wall int64
	}
	seen := map[start]string{}
	for _, in := range ins {
		r, err := tracefile.Open(in.Path)
		switch {
		case err != nil && len(ins) > 1 && cutBeforeMeta(err):
			// A node whose recording stopped before it wrote its
			// meta (killed at its start): left out, as a window that
			// could not be fetched is, the others merged.
			m.warnf("%s left out: %v (its recording stopped before it began)", in.name(), errors.Unwrap(err))
			continue
		case err != nil:
			return nil, err // Open names the path
		}
		meta := r.Meta()
		k := start{meta.Host, int64(meta.StartBoot), meta.StartWall.UnixNano()}
		if other, ok := seen[k]; ok {
			r.Close()
			return nil, fmt.Errorf("%s and %s are the same trace (%s, started at %s): merged twice, each of its processes would be two",
				other, in.name(), orUnknown(meta.Host), meta.StartWall.UTC().Format(time.RFC3339Nano))
		}
		seen[k] = in.name()
		m.ins = append(m.ins, &input{i: len(m.ins), in: in, r: r, meta: meta, pids: map[uint32]uint32{}})
		if meta.StartWall.IsZero() {
			return nil, fmt.Errorf("%s: its meta has no wall-clock start: it cannot be put on a timeline with others", in.name())
		}
	}
	if len(m.ins) == 0 {
		return nil, errors.New("no trace to merge: " + strings.Join(m.res.Warnings, "; "))
	}
	meta := m.clock(tool)
	tw, err := tracefile.NewWriter(w, meta)
	if err != nil {
		return nil, err
	}
	m.w = tw
	for _, in := range m.ins {
		m.advance(in)
		if in.head != nil {
			heap.Push(&m.heads, in)
		}
	}
	for m.heads.Len() > 0 {
		in := m.heads[0]
		if err := m.put(in, in.head); err != nil {
			return nil, err
		}
		m.advance(in)
		if in.head == nil {
			heap.Pop(&m.heads)
		} else {
			heap.Fix(&m.heads, 0)
		}
	}
	if err := m.finish(); err != nil {
		return nil, err
	}
	return m.res, nil
}

type merger struct {
	ins   []*input
	heads heads
	w     *tracefile.Writer
	res   *Result
	used  map[uint32]bool // PIDs given so far
	next  uint32          // the next renumbered PID
	libs  map[string]bool // libraries attached at the start, written once
	procs map[procKey]int // each process's trace, to find one in two
	last  uint64          // the latest merged time written
}

// procKey is a process as its host knows it.
type procKey struct {
	host  string
	pid   uint32
	start uint64
}

// input is one trace being merged.
type input struct {
	i      int
	in     Input
	r      *tracefile.Reader
	meta   tracefile.Meta
	offset int64 // added to its times
	pids   map[uint32]uint32
	head   *frame // the next frame, nil at its end
	at     uint64 // the merged time of its latest frame: what a frame without one takes
	end    tracefile.NodeEnd
	nested []tracefile.NodeEnd // a merged trace's own nodes' ends
	count  *tracefile.Counters // its latest counters
}

// frame is one frame read and waiting: what the reader returned, the
// event's bytes copied (the reader reuses them), and its merged time.
type frame struct {
	rec tracefile.Record
	raw []byte
	at  uint64
}

func (m *merger) close() {
	for _, in := range m.ins {
		in.r.Close()
	}
}

// clock chooses the merged clock and returns the merged meta. A node's
// time t is t + offset, offset = B + (its wall start − the earliest) −
// its boot start: its start falls at its wall-clock distance from the
// earliest, and B, the merged clock's reading at the earliest start, is
// the least that keeps every node's time 0 (its boot) at or above 0.
func (m *merger) clock(tool string) tracefile.Meta {
	earliest := m.ins[0].meta.StartWall
	for _, in := range m.ins[1:] {
		if in.meta.StartWall.Before(earliest) {
			earliest = in.meta.StartWall
		}
	}
	var base int64
	for _, in := range m.ins {
		base = max(base, int64(in.meta.StartBoot)-int64(in.meta.StartWall.Sub(earliest)))
	}
	meta := tracefile.Meta{Tool: tool, StartWall: earliest, StartBoot: uint64(base)}
	var kernels []string
	for _, in := range m.ins {
		in.offset = base + int64(in.meta.StartWall.Sub(earliest)) - int64(in.meta.StartBoot)
		in.at = in.time(in.meta.StartBoot)
		in.end.Host = in.meta.Host
		nodes := in.meta.Nodes // a merged trace merged again: its nodes, their offsets composed
		for i := range nodes {
			nodes[i].Offset += in.offset
		}
		if len(nodes) == 0 {
			nodes = []tracefile.Node{{Host: in.meta.Host, Kernel: in.meta.Kernel, Tool: in.meta.Tool, Trace: in.in.name(),
				StartWall: in.meta.StartWall, StartBoot: in.meta.StartBoot, ClockPair: in.meta.ClockPair,
				Clock: in.meta.Clock, Offset: in.offset}}
		}
		meta.Nodes = append(meta.Nodes, nodes...)
		m.res.Nodes = append(m.res.Nodes, nodes...)
		meta.All = meta.All || in.meta.All
		if !slices.Contains(kernels, in.meta.Kernel) {
			kernels = append(kernels, in.meta.Kernel)
		}
	}
	meta.Kernel = strings.Join(kernels, ", ")
	if len(m.ins) == 1 { // else each node's command and PIDs are its own
		meta.Command, meta.PIDs = m.ins[0].meta.Command, m.ins[0].meta.PIDs
	}
	return meta
}

// time moves a time of the input's host onto the merged clock; 0 (unknown)
// stays 0.
func (in *input) time(t uint64) uint64 {
	if t == 0 {
		return 0
	}
	return uint64(int64(t) + in.offset)
}

// advance reads the input's next frame into head (nil at its end, or
// where it stops making sense: said in its NodeEnd).
func (m *merger) advance(in *input) {
	in.head = nil
	for {
		rec, err := in.r.Next()
		switch {
		case err == io.EOF:
			if !in.end.Complete {
				in.end.Warning = "no end record: its tracer did not stop cleanly; merged up to what it wrote"
			}
			return
		case errors.Is(err, tracefile.ErrTruncated), errors.Is(err, tracefile.ErrCorrupt), err != nil:
			in.end.Warning = fmt.Sprintf("merged up to where it stops: %v", err)
			return
		}
		f := &frame{rec: rec}
		switch rec.Type {
		case tracefile.TypeMeta:
			continue
		case tracefile.TypeEvent:
			f.raw = append([]byte(nil), rec.Raw...)
			f.at = in.time(rec.Event.Time)
		case tracefile.TypeProcess:
			f.at = in.time(rec.Process.Time)
		case tracefile.TypeCounters:
			f.at = in.time(rec.Counters.Time)
		case tracefile.TypeEnd:
			f.at = in.time(rec.End.Time)
		case tracefile.TypeNVML:
			f.at = in.time(rec.NVML.Time)
		case tracefile.TypeAttach:
			f.at = in.time(rec.Attach.Time)
		}
		// A frame without a time of its own (python, symbols, an attach
		// at the start) keeps its place after the one before it.
		if f.at == 0 || f.at < in.at {
			f.at = in.at
		}
		in.at = f.at
		in.head = f
		return
	}
}

// pid returns the merged PID of the input's process pid, giving it one
// the first time.
func (m *merger) pid(in *input, pid uint32) uint32 {
	if pid == 0 {
		return 0
	}
	if p, ok := in.pids[pid]; ok {
		return p
	}
	p := pid
	if m.used[p] {
		for m.used[m.next] {
			m.next++
		}
		p = m.next
		m.next++
		m.res.Renumbered++
	}
	m.used[p] = true
	in.pids[pid] = p
	return p
}

// put writes one frame of in, on the merged clock and with merged PIDs.
func (m *merger) put(in *input, f *frame) error {
	m.last = max(m.last, f.at)
	rec := f.rec
	switch rec.Type {
	case tracefile.TypeEvent:
		in.end.Events++
		m.res.Events++
		// struct ct_event: ts_ns at 0, pid at 32 (docs/trace-format.md).
		binary.LittleEndian.PutUint64(f.raw[0:], in.time(rec.Event.Time))
		binary.LittleEndian.PutUint32(f.raw[32:], m.pid(in, rec.Event.PID))
		return m.w.WriteEvent(f.raw)
	case tracefile.TypeProcess:
		p := rec.Process
		// A merged trace merged again keeps its processes' nodes and
		// node PIDs.
		p.Node = cmp.Or(p.Node, orUnknown(in.meta.Host))
		own := p.PID
		host := cmp.Or(p.NodePID, own)
		k := procKey{p.Node, host, p.Start}
		if j, ok := m.procs[k]; ok && j != in.i && p.Start != 0 {
			m.warnf("pid %d of %s is in both %s and %s: its events are counted twice", host, p.Node,
				m.ins[j].in.name(), in.in.name())
		}
		m.procs[k] = in.i
		p.PID = m.pid(in, own)
		if p.PID != host {
			p.NodePID = host
		} else {
			p.NodePID = 0
		}
		p.Time, p.Start = in.time(p.Time), in.time(p.Start)
		return m.w.WriteProcess(p)
	case tracefile.TypePython:
		rec.Python.PID = m.pid(in, rec.Python.PID)
		return m.w.WritePython(rec.Python)
	case tracefile.TypeSymbols:
		return m.w.WriteSymbols(rec.Symbols)
	case tracefile.TypeAttach:
		a := rec.Attach
		if a.Time == 0 { // at the start: every node attached the same libraries, most often
			k := strings.Join([]string{a.Library, a.BuildID, strings.Join(a.Symbols, ","), strings.Join(a.Missing, ",")}, "\x00")
			if m.libs[k] {
				return nil
			}
			m.libs[k] = true
		}
		a.Time, a.PID = in.time(a.Time), m.pid(in, a.PID)
		return m.w.WriteAttach(a)
	case tracefile.TypeCounters:
		in.count = rec.Counters
		return m.w.WriteCounters(m.counters(f.at))
	case tracefile.TypeNVML:
		n := rec.NVML
		n.Time = in.time(n.Time)
		n.Devices = nil              // each host numbers its GPUs from 0
		for i := range n.Processes { // a process's devices are its node's: they stay
			n.Processes[i].PID = m.pid(in, n.Processes[i].PID)
		}
		return m.w.WriteNVML(n)
	case tracefile.TypeEnd:
		in.end.Complete = true
		in.end.Reason = rec.End.Reason
		in.nested = rec.End.Nodes
	}
	return nil
}

// counters sums every input's latest counters.
func (m *merger) counters(at uint64) *tracefile.Counters {
	sum := &tracefile.Counters{Time: at, Counters: map[string]uint64{}}
	for _, in := range m.ins {
		if in.count == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(in.count.Counters)) {
			sum.Counters[k] += in.count.Counters[k]
		}
		sum.Lost += in.count.Lost
		sum.LostStopping += in.count.LostStopping
	}
	return sum
}

// finish writes the totals and the end frame, saying how each trace
// ended.
func (m *merger) finish() error {
	for _, in := range m.ins {
		if in.count != nil {
			in.end.Lost = in.count.Lost
		}
		if in.end.Warning != "" {
			m.warnf("%s (%s): %s", in.in.name(), orUnknown(in.meta.Host), in.end.Warning)
		}
		switch {
		case len(in.meta.Nodes) == 0:
			m.res.Ends = append(m.res.Ends, in.end)
		case len(in.nested) == len(in.meta.Nodes): // a merged trace: its nodes' own ends
			m.res.Ends = append(m.res.Ends, in.nested...)
		default: // one cut short: each of its nodes ended as it did
			for _, n := range in.meta.Nodes {
				e := in.end
				e.Host = n.Host
				m.res.Ends = append(m.res.Ends, e)
			}
		}
	}
	if err := m.w.WriteCounters(m.counters(m.last)); err != nil {
		return err
	}
	end := &tracefile.End{Time: m.last, Events: m.res.Events, Nodes: m.res.Ends,
		Reason: "merged " + traces(len(m.ins))}
	if err := m.w.WriteEnd(end); err != nil {
		return err
	}
	return m.w.Flush()
}

func (m *merger) warnf(format string, args ...any) {
	m.res.Warnings = append(m.res.Warnings, fmt.Sprintf(format, args...))
}

// traces counts traces in words: "1 trace", "2 traces".
func traces(n int) string {
	if n == 1 {
		return "1 trace"
	}
	return fmt.Sprintf("%d traces", n)
}

// cutBeforeMeta reports whether err is a trace's that ends before its
// meta: an empty file, or one cut in its header or first frame.
func cutBeforeMeta(err error) bool {
	return errors.Is(err, tracefile.ErrTruncated) || strings.Contains(err.Error(), "empty file")
}

func orUnknown(host string) string { return cmp.Or(host, "an unknown host") }

// heads orders the inputs by their next frame's merged time, then by
// their order on the command line.
type heads []*input

func (h heads) Len() int { return len(h) }
func (h heads) Less(i, j int) bool {
	return cmp.Or(cmp.Compare(h[i].head.at, h[j].head.at), cmp.Compare(h[i].i, h[j].i)) < 0
}
func (h heads) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *heads) Push(x any)   { *h = append(*h, x.(*input)) }
func (h *heads) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
