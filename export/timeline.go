package export

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// WritePerfetto writes the trace at path as Chrome trace-event JSON, which
// ui.perfetto.dev and chrome://tracing open: per process, a counter track
// of live GPU memory per device ("GPU N memory"), one of tensor memory per
// device where a framework's allocator reports it ("GPU N tensors"), one of
// pinned host memory, and an instant event per failed allocation. Timestamps are
// microseconds since the start of the recording.
//
// The JSON is written while the trace is replayed, so memory stays bounded
// whatever the number of events.
func WritePerfetto(w io.Writer, path string, opts Options) error {
	r, err := tracefile.Open(path)
	if err != nil {
		return err
	}
	meta := r.Meta()
	r.Close()

	tw := &timelineWriter{w: bufio.NewWriterSize(w, 256<<10), start: meta.StartBoot, named: map[uint32]bool{},
		last: map[uint32]*[]trackTime{}}
	tw.raw(`{"displayTimeUnit":"ms","traceEvents":[`)
	t, err := replay.Read(path, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		p := ch.Process
		// A process's end is no step: its tracks end at what it held when
		// it ended, the report's live bytes at its end (held at exit).
		if p == nil || !opts.selected(p.PID) || ch.Exit {
			return nil
		}
		tw.process(p)
		// One counter value per track and event: an allocation that
		// displaced a block on the same track (its free was lost) is one
		// step.
		// Several allocations freed at once (a context's death, an
		// unmap) are one step per track too.
		var stepped []track
		for f := range ch.AllFreed() {
			if tr := trackOf(f); (ch.Alloc == nil || !sameTrack(f, ch.Alloc)) && !slices.Contains(stepped, tr) {
				stepped = append(stepped, tr)
				tw.counter(p, f, ev.End())
			}
		}
		if a := ch.Alloc; a != nil {
			tw.counter(p, a, ev.End())
		}
		if ch.Stack != nil && ch.Alloc == nil { // a failed allocation call
			// Written once the replay is done: frames are named then.
			tw.failures = append(tw.failures, timelineFailure{ev: *ev, stack: ch.Stack})
			tw.failures[len(tw.failures)-1].ev.Stack = nil
		}
		if ch.Implicit && ch.Freed != nil {
			tw.implicitFree(ev, ch)
		}
		return tw.err
	}})
	if err != nil {
		return err
	}
	if err := opts.checkReplay(t, 0); err != nil {
		return err
	}
	tw.names(t)
	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	for i := range tw.failures {
		tw.failure(&tw.failures[i], syms)
	}
	opts.warnGone(syms)
	tw.raw("]}\n")
	if tw.err == nil {
		tw.err = tw.w.Flush()
	}
	if tw.err != nil {
		return fmt.Errorf("perfetto: write: %w", tw.err)
	}
	return nil
}

// track names the counter track an allocation counts on.
type track struct {
	kind   int8 // 0 GPU segments, 1 pinned host, 2 tensors
	device int32
}

func trackOf(a *ledger.Allocation) track {
	info := a.API.Info()
	switch {
	case info.Layer == events.LayerTensor:
		return track{2, a.Device}
	case info.Kind == events.KindHost:
		return track{1, 0}
	}
	return track{0, a.Device}
}

// sameTrack reports whether a and b count on the same counter track.
func sameTrack(a, b *ledger.Allocation) bool { return trackOf(a) == trackOf(b) }

// trackTime is the time of a counter track's latest value.
type trackTime struct {
	track
	t uint64
}

type timelineWriter struct {
	w     *bufio.Writer
	start uint64
	n     int // events written
	named map[uint32]bool
	// last holds each process's counter tracks and the time of their
	// latest values. Events reach the file in ring-buffer order, not
	// strictly by time, and a counter value is the live total after every
	// event before it in the file: stamped earlier than the value before
	// it, the viewer would sort it first and leave the wrong total
	// standing. So a late event takes its counter's latest time instead.
	last map[uint32]*[]trackTime
	err  error
	buf  []byte
	// failures are the failed calls, written last with their stacks.
	failures []timelineFailure
	threads  map[[2]uint32]bool // (pid, tid) given a thread_name
	order    []procName         // the processes with tracks, as first seen (jobs_timeline.go)
}

// timelineFailure is a failed allocation call and its stack.
type timelineFailure struct {
	ev    events.Event
	stack *ledger.Stack
}

func (tw *timelineWriter) raw(s string) {
	if tw.err == nil {
		_, tw.err = tw.w.WriteString(s)
	}
}

// event writes one trace event: fields is the JSON object's body.
func (tw *timelineWriter) event(body []byte) {
	if tw.n > 0 {
		tw.raw(",\n")
	} else {
		tw.raw("\n")
	}
	tw.n++
	if tw.err == nil {
		tw.w.WriteByte('{')
		_, tw.err = tw.w.Write(body)
		tw.w.WriteByte('}')
	}
}

// ts formats a boot-time timestamp as microseconds since the start.
func (tw *timelineWriter) ts(b []byte, t uint64) []byte {
	var d uint64
	if t > tw.start {
		d = t - tw.start
	}
	b = strconv.AppendUint(b, d/1000, 10)
	b = append(b, '.')
	frac := d % 1000
	b = append(b, byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
	return b
}

// process notes that p has tracks; names writes their titles once the
// replay has read every process frame.
func (tw *timelineWriter) process(p *ledger.Process) {
	if tw.named[p.PID] {
		return
	}
	tw.named[p.PID] = true
	tw.order = append(tw.order, procName{p.PID, p.Comm})
}

// counter writes the live bytes of a's device (or of pinned host memory)
// in p after an event changed them.
func (tw *timelineWriter) counter(p *ledger.Process, a *ledger.Allocation, t uint64) {
	tr := trackOf(a)
	t = tw.stamp(p.PID, tr, t)
	b := append(tw.buf[:0], `"ph":"C","pid":`...)
	b = strconv.AppendUint(b, uint64(p.PID), 10)
	b = append(b, `,"ts":`...)
	b = tw.ts(b, t)
	switch tr.kind {
	case 1:
		b = append(b, `,"name":"pinned host memory","args":{"live_bytes":`...)
		b = strconv.AppendUint(b, p.HostLive, 10)
	default:
		var live uint64
		if d := p.Devices[a.Device]; d != nil {
			live = d.Live
			if tr.kind == 2 {
				live = d.TensorLive
			}
		}
		b = append(b, `,"name":"GPU `...)
		b = strconv.AppendInt(b, int64(a.Device), 10)
		if tr.kind == 2 {
			b = append(b, ` tensors","args":{"live_bytes":`...)
		} else {
			b = append(b, ` memory","args":{"live_bytes":`...)
		}
		b = strconv.AppendUint(b, live, 10)
	}
	b = append(b, '}')
	tw.event(b)
	tw.buf = b
}

// stamp returns the time to give pid's counter tr a value of time t: t,
// or the counter's latest time when t is before it. A process has a few
// tracks (one per device, and pinned host memory): a scan beats a map
// keyed by track.
func (tw *timelineWriter) stamp(pid uint32, tr track, t uint64) uint64 {
	tracks := tw.last[pid]
	if tracks == nil {
		tracks = new([]trackTime)
		tw.last[pid] = tracks
	}
	for i := range *tracks {
		if tt := &(*tracks)[i]; tt.track == tr {
			tt.t = max(tt.t, t)
			return tt.t
		}
	}
	*tracks = append(*tracks, trackTime{tr, t})
	return t
}

// implicitFree marks a context's death that freed memory: the call, and
// how many allocations of how many bytes went with the context.
func (tw *timelineWriter) implicitFree(ev *events.Event, ch ledger.Change) {
	var n, bytes uint64
	for a := range ch.AllFreed() {
		n++
		bytes += a.Size
	}
	name, _ := json.Marshal(fmt.Sprintf("%s: %d allocations (%s) freed with their context", ev.API, n, units.Bytes(bytes)))
	b := fmt.Appendf(tw.buf[:0], `"ph":"i","s":"p","name":%s,"pid":%d,"tid":%d,"ts":`, name, ev.PID, ev.TID)
	b = tw.ts(b, ev.End())
	b = fmt.Appendf(b, `,"args":{"api":"%s","context":"%#x","device":%d,"implicit_frees":%d,"implicit_free_bytes":%d}`,
		ev.API, ev.Addr, ev.Device, n, bytes)
	tw.event(b)
	tw.buf = b
}

// failure writes a failed call as an instant on its thread, with its
// stack (innermost first) in args, after the thread's name.
func (tw *timelineWriter) failure(f *timelineFailure, syms *replay.Symbols) {
	ev := &f.ev
	if key := [2]uint32{ev.PID, ev.TID}; !tw.threads[key] {
		if tw.threads == nil {
			tw.threads = map[[2]uint32]bool{}
		}
		tw.threads[key] = true
		name, _ := json.Marshal(fmt.Sprintf("%s (%d)", ev.Comm, ev.TID))
		tw.event(fmt.Appendf(tw.buf[:0], `"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":{"name":%s}`,
			ev.PID, ev.TID, name))
	}
	var stack []string
	if f.stack != nil {
		for _, fr := range syms.Frames(f.stack) {
			stack = append(stack, timelineFrame(fr))
		}
	}
	stackJSON, _ := json.Marshal(stack)
	name, _ := json.Marshal(fmt.Sprintf("%s failed: %s", ev.API, ev.API.ResultName(ev.Result)))
	errName, _ := json.Marshal(ev.API.ResultName(ev.Result))
	b := fmt.Appendf(tw.buf[:0], `"ph":"i","s":"t","name":%s,"pid":%d,"tid":%d,"ts":`, name, ev.PID, ev.TID)
	b = tw.ts(b, ev.End())
	b = fmt.Appendf(b, `,"args":{"api":"%s","size":%d,"device":%d,"result":%d,"error":%s,"stack":%s}`,
		ev.API, ev.Size, ev.Device, ev.Result, errName, stackJSON)
	tw.event(b)
	tw.buf = b
}

// timelineFrame is one stack line: function (file:line), or the module
// and address where the function is unknown.
func timelineFrame(f symbolize.Frame) string {
	switch {
	case f.Function != "" && f.File != "":
		return fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
	case f.Function != "":
		return f.Function
	case f.Module != "":
		return fmt.Sprintf("%#x (%s)", f.Addr, f.Module)
	}
	return fmt.Sprintf("%#x", f.Addr)
}
