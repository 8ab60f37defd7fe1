package export

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// WritePerfetto writes the trace at path as Chrome trace-event JSON, which
// ui.perfetto.dev and chrome://tracing open: per process, a counter track
// of live GPU memory per device ("GPU N memory") and one of pinned host
// memory, and an instant event per failed allocation. Timestamps are
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

	tw := &timelineWriter{w: bufio.NewWriterSize(w, 256<<10), start: meta.StartBoot, named: map[uint32]bool{}}
	tw.raw(`{"displayTimeUnit":"ms","traceEvents":[`)
	_, err = replay.Read(path, replay.Options{OnEvent: func(ev *events.Event, ch events.Change) error {
		p := ch.Process
		if p == nil || !opts.selected(p.PID) {
			return nil
		}
		tw.process(p)
		// One counter value per track and event: an allocation that
		// displaced a block on the same track (its free was lost) is one
		// step.
		if f := ch.Freed; f != nil && (ch.Alloc == nil || !sameTrack(f, ch.Alloc)) {
			tw.counter(p, f, ev.End())
		}
		if a := ch.Alloc; a != nil {
			tw.counter(p, a, ev.End())
		}
		if ch.Stack != nil && ch.Alloc == nil { // a failed allocation call
			tw.failure(ev)
		}
		return tw.err
	}})
	if err != nil {
		return err
	}
	tw.raw("]}\n")
	if tw.err == nil {
		tw.err = tw.w.Flush()
	}
	if tw.err != nil {
		return fmt.Errorf("perfetto: write: %w", tw.err)
	}
	return nil
}

// sameTrack reports whether a and b count on the same counter track.
func sameTrack(a, b *events.Allocation) bool {
	ah, bh := a.API.Info().Kind == events.KindHost, b.API.Info().Kind == events.KindHost
	return ah == bh && (ah || a.Device == b.Device)
}

type timelineWriter struct {
	w     *bufio.Writer
	start uint64
	n     int // events written
	named map[uint32]bool
	err   error
	buf   []byte
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

func (tw *timelineWriter) process(p *events.Process) {
	if tw.named[p.PID] {
		return
	}
	tw.named[p.PID] = true
	name, _ := json.Marshal(fmt.Sprintf("%s (%d)", p.Comm, p.PID))
	b := fmt.Appendf(tw.buf[:0], `"ph":"M","name":"process_name","pid":%d,"tid":%d,"args":{"name":%s}`, p.PID, p.PID, name)
	tw.event(b)
	tw.buf = b
}

// counter writes the live bytes of a's device (or of pinned host memory)
// in p after an event changed them.
func (tw *timelineWriter) counter(p *events.Process, a *events.Allocation, t uint64) {
	b := append(tw.buf[:0], `"ph":"C","pid":`...)
	b = strconv.AppendUint(b, uint64(p.PID), 10)
	b = append(b, `,"ts":`...)
	b = tw.ts(b, t)
	if a.API.Info().Kind == events.KindHost {
		b = append(b, `,"name":"pinned host memory","args":{"live_bytes":`...)
		b = strconv.AppendUint(b, p.HostLive, 10)
	} else {
		var live uint64
		if d := p.Devices[a.Device]; d != nil {
			live = d.Live
		}
		b = append(b, `,"name":"GPU `...)
		b = strconv.AppendInt(b, int64(a.Device), 10)
		b = append(b, ` memory","args":{"live_bytes":`...)
		b = strconv.AppendUint(b, live, 10)
	}
	b = append(b, '}')
	tw.event(b)
	tw.buf = b
}

func (tw *timelineWriter) failure(ev *events.Event) {
	name, _ := json.Marshal(fmt.Sprintf("%s failed: %s", ev.API, ev.API.ResultName(ev.Result)))
	errName, _ := json.Marshal(ev.API.ResultName(ev.Result))
	b := fmt.Appendf(tw.buf[:0], `"ph":"i","s":"p","name":%s,"pid":%d,"tid":%d,"ts":`, name, ev.PID, ev.TID)
	b = tw.ts(b, ev.End())
	b = fmt.Appendf(b, `,"args":{"api":"%s","size":%d,"device":%d,"result":%d,"error":%s}`,
		ev.API, ev.Size, ev.Device, ev.Result, errName)
	tw.event(b)
	tw.buf = b
}
