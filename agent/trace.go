package agent

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// A /trace window is a stream, not a ring of history: from the request
// on, the records of the process (or of all) are queued as they arrive
// and written to the client as a trace file, with the process frames
// first. The agent keeps no raw records otherwise.

// traceSub is one trace window being written.
type traceSub struct {
	pid     uint32 // 0: every process
	items   chan traceItem
	dropped atomic.Uint64
	queued  atomic.Int64 // bytes of records in items (TraceWindowBytes at most)
	closed  bool
	// pyDone counts the frames of each Python table written so far (on
	// the reader goroutine).
	pyDone map[*pystack.Table]int
}

type traceItem struct {
	raw  []byte
	proc *procmodel.Capture
	py   *tracefile.Python
}

func (s *traceSub) wants(pid uint32) bool { return s.pid == 0 || s.pid == pid }

func (s *traceSub) event(pid uint32, raw []byte, t *Totals) {
	if !s.wants(pid) {
		return
	}
	if s.queued.Load()+int64(len(raw)) > TraceWindowBytes {
		s.dropped.Add(1)
		t.TraceDropped++
		return
	}
	select {
	case s.items <- traceItem{raw: raw}:
		s.queued.Add(int64(len(raw)))
	default:
		s.dropped.Add(1)
		t.TraceDropped++
	}
}

// traceQueue is the queue of a window of d: sized to it, within bounds.
func traceQueue(d time.Duration) int {
	return min(max(int(d.Seconds()*traceQueuePerSecond), traceQueueMin), traceQueueMax)
}

// python queues what replay needs to name the Python frames of pid's
// next event: its interpreter loop's ranges the first time, then the
// frames the session resolved since the last.
func (s *traceSub) python(pid uint32, t *pystack.Table, tot *Totals) {
	if t == nil || !s.wants(pid) {
		return
	}
	done, seen := s.pyDone[t]
	if seen && done == t.Len() {
		return
	}
	if s.pyDone == nil {
		s.pyDone = map[*pystack.Table]int{}
	}
	var recs []*tracefile.Python
	if !seen {
		// Eval without codes: a new table, should the PID be another's now.
		recs = append(recs, &tracefile.Python{PID: pid, Minor: t.Minor, Eval: t.Eval})
	}
	if done < t.Len() {
		recs = append(recs, &tracefile.Python{PID: pid, Codes: procmodel.PyCodesFile(t.Codes(done))})
	}
	for _, r := range recs {
		select {
		case s.items <- traceItem{py: r}:
		default:
			s.dropped.Add(1)
			tot.TraceDropped++
			return // the next event tries again
		}
	}
	s.pyDone[t] = t.Len()
}

func (s *traceSub) process(p *procmodel.Capture) {
	if !s.wants(p.PID) {
		return
	}
	select {
	case s.items <- traceItem{proc: p}:
	default:
		s.dropped.Add(1)
	}
}

func (s *traceSub) end() {
	if !s.closed {
		s.closed = true
		close(s.items)
	}
}

// Trace writes a trace file of the window from now to now+d to w: every
// event of pid (0: of every process) as the recorder writes it, after the
// process frames the agent holds. `cudatrace report` and `export` read it.
// Records a slow client cannot take are dropped and counted in the trace's
// lost events.
func (a *Agent) Trace(ctx context.Context, w io.Writer, pid uint32, d time.Duration) error {
	sub := &traceSub{pid: pid, items: make(chan traceItem, traceQueue(d))}
	var (
		procs     []*procmodel.Capture
		before    []traceItem
		lostStart uint64
		err       error
	)
	rerr := a.do(ctx, func() {
		if pid != 0 && a.procs[pid] == nil {
			err = fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
			return
		}
		for _, p := range a.pids() {
			if c := a.model.Get(p).Current(); sub.wants(p) && c != nil {
				procs = append(procs, c)
			}
		}
		before = a.liveAtStart(sub)
		lostStart = a.res.Lost
		a.subs = append(a.subs, sub)
	})
	if rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	unsubscribe := func() (lost uint64) {
		a.do(context.Background(), func() {
			for i, s := range a.subs {
				if s == sub {
					a.subs = append(a.subs[:i], a.subs[i+1:]...)
					break
				}
			}
			sub.end()
			lost = a.res.Lost - lostStart
		})
		return lost
	}

	meta := record.TraceMeta("cudatrace " + a.opts.Version + " agent")
	meta.All = pid == 0
	if pid != 0 {
		meta.PIDs = []int{int(pid)}
	}
	tw, err := record.NewTraceWriter(w, meta)
	if err != nil {
		unsubscribe()
		return err
	}
	win := &window{tw: tw, procs: procmodel.New(), pcs: map[*procmodel.Capture]map[uint64]bool{}}
	for _, p := range procs {
		win.write(traceItem{proc: p})
	}
	var events uint64
	for _, it := range before {
		if err := win.write(it); err != nil {
			unsubscribe()
			return err
		}
		events++
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	flush := time.NewTicker(200 * time.Millisecond)
	defer flush.Stop()
	reason := "window elapsed"
loop:
	for {
		select {
		case it, ok := <-sub.items:
			if !ok {
				reason = "agent stopped"
				break loop
			}
			sub.queued.Add(-int64(len(it.raw)))
			if err := win.write(it); err != nil {
				unsubscribe()
				return err
			}
			if it.raw != nil {
				events++
			}
		case <-flush.C:
			if err := tw.Flush(); err != nil {
				unsubscribe()
				return err
			}
		case <-timer.C:
			break loop
		case <-ctx.Done():
			unsubscribe()
			return ctx.Err()
		}
	}
	lost := unsubscribe()
	// What was queued before the unsubscribe is in the window too.
	for it := range sub.items {
		if err := win.write(it); err != nil {
			return err
		}
		if it.raw != nil {
			events++
		}
	}
	if err := win.names(a.syms); err != nil {
		return err
	}
	lost += sub.dropped.Load()
	return tw.Finish(tracefile.Counters{Counters: map[string]uint64{"agent_dropped": sub.dropped.Load()}, Lost: lost},
		tracefile.End{Events: events, Reason: reason})
}

// liveAtStart is what a window of sub starts with, on the reader's
// goroutine as it subscribes: for each process it wants, its Python frames'
// table, then each allocation (segments, pinned host memory, tensors) the
// agent's ledger holds live, as an allocation record flagged
// events.FlagBefore, with the ledger's stack (Python frames merged, named
// by that table) and stamped now. So the window's report starts where the
// agent's /metrics stands, and a free in the window of memory made before
// it frees what the window knows.
func (a *Agent) liveAtStart(sub *traceSub) []traceItem {
	var out []traceItem
	now := record.BootNow()
	for _, pid := range a.pids() {
		p := a.ledger.Process(pid)
		if !sub.wants(pid) || p == nil {
			continue
		}
		if t := a.model.Python(pid); t != nil {
			out = append(out, traceItem{py: &tracefile.Python{PID: pid, Minor: t.Minor, Eval: t.Eval,
				Codes: procmodel.PyCodesFile(t.Codes(0))}})
			if sub.pyDone == nil {
				sub.pyDone = map[*pystack.Table]int{}
			}
			sub.pyDone[t] = t.Len()
		}
		for _, al := range slices.Concat(p.LiveAllocations(), p.LiveTensors()) {
			ev := events.Event{Time: now, PID: pid, TID: al.TID, Comm: p.Comm, API: al.API, Addr: al.Addr,
				Size: al.Size, Device: al.Device, Flags: events.FlagBefore}
			if al.Stack != nil {
				ev.Stack = al.Stack.Frames
			}
			out = append(out, traceItem{raw: events.Encode(nil, &ev)})
		}
	}
	return out
}

// window writes a trace window's items and gathers its processes' return
// addresses: the window is read elsewhere, on a machine without the files
// those processes mapped, so it names its frames itself (names).
type window struct {
	tw *record.TraceWriter
	// procs holds the window's captures, as replay will read them: each
	// event's addresses are named against its process's capture current
	// then (procmodel.Processes).
	procs *procmodel.Processes
	pcs   map[*procmodel.Capture]map[uint64]bool // the return addresses of the events read against each capture
	ev    events.Event
}

func (w *window) write(it traceItem) error {
	switch {
	case it.proc != nil:
		w.procs.Add(it.proc)
		return w.tw.WriteProcess(it.proc.File())
	case it.py != nil:
		return w.tw.WritePython(it.py)
	}
	if events.Decode(it.raw, &w.ev) == nil && len(w.ev.Stack) > 0 {
		w.note(&w.ev)
	}
	return w.tw.WriteEvent(it.raw)
}

// note gathers ev's return addresses under the capture of its process
// current now. A process is captured before its first event is handed on,
// so there is one; an event without is left unnamed.
func (w *window) note(ev *events.Event) {
	c := w.procs.Get(ev.PID).Current()
	if c == nil {
		return
	}
	set := w.pcs[c]
	if set == nil {
		set = map[uint64]bool{}
		w.pcs[c] = set
	}
	for _, pc := range ev.Stack {
		set[pc] = true
	}
}

// names writes the names of the window's native frames, each (build ID,
// file offset) once, as record --portable does: report and export on
// another machine take them where no file there holds the build. Without
// a symbolizer (--no-symbolize) there are none.
func (w *window) names(sym *symbolize.Symbolizer) error {
	if sym == nil {
		return nil
	}
	var out []procmodel.Symbol
	byProcess := func(a, b *procmodel.Capture) int {
		return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.Time, b.Time))
	}
	for _, c := range slices.SortedFunc(maps.Keys(w.pcs), byProcess) {
		out = append(out, procmodel.Names(sym, c, slices.Sorted(maps.Keys(w.pcs[c])))...)
	}
	return w.tw.WriteNames(out) // names each (build ID, offset) once
}
