package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// HumanBytes formats a byte count 1024-based: "512 B", "1.5 MiB". It never
// prints "1024.0" of a unit: that is "1.0" of the next.
func HumanBytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	const units = "KMGTPE"
	v, i := float64(n)/1024, 0
	for i < len(units)-1 && math.Round(v*10)/10 >= 1024 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, units[i])
}

// WriteSummary prints the per-process table of a ledger: what `record`
// prints when it stops. lost is the count of events the BPF side dropped.
func WriteSummary(w io.Writer, l *events.Ledger, lost uint64) error {
	var rows []Process
	for _, p := range l.Processes() {
		rows = append(rows, Process{PID: p.PID, Comm: p.Comm, Allocs: p.Allocs, Frees: p.Frees, Failed: p.Failed,
			AllocBytes: p.AllocBytes, LiveBytes: p.Live, PeakBytes: p.Peak, HostLiveBytes: p.HostLive,
			Devices: devices(p)})
	}
	if err := writeProcesses(w, rows); err != nil {
		return err
	}
	if lost > 0 {
		if _, err := fmt.Fprintf(w, "WARNING: %d events were lost: the figures above miss them\n", lost); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
	}
	return nil
}

// writeProcesses prints one row per process, and one per device under a
// process that used more than one.
func writeProcesses(w io.Writer, rows []Process) error {
	if len(rows) == 0 {
		if _, err := fmt.Fprintln(w, "No CUDA allocation traced."); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
		return nil
	}
	t := table{right: []bool{true, false, true, true, true, true, true, true, true}}
	t.add("PID", "COMM", "ALLOCS", "FREES", "FAILED", "ALLOCATED", "LIVE", "PEAK", "HOST-LIVE")
	for _, p := range rows {
		t.add(fmt.Sprint(p.PID), p.Comm, fmt.Sprint(p.Allocs), fmt.Sprint(p.Frees), fmt.Sprint(p.Failed),
			HumanBytes(p.AllocBytes), HumanBytes(p.LiveBytes), HumanBytes(p.PeakBytes), HumanBytes(p.HostLiveBytes))
		if len(p.Devices) > 1 {
			for _, d := range p.Devices {
				t.add("", fmt.Sprintf("  gpu %d", d.Device), "", "", "", "", HumanBytes(d.LiveBytes), HumanBytes(d.PeakBytes), "")
			}
		}
	}
	if err := t.write(w); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// table lines up columns, each aligned left or right (tabwriter aligns all
// one way).
type table struct {
	right []bool
	rows  [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer) error {
	width := make([]int, len(t.right))
	for _, row := range t.rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for _, row := range t.rows {
		var line strings.Builder
		for i, c := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if t.right[i] {
				line.WriteString(pad + c)
			} else {
				line.WriteString(c + pad)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " "))
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteText writes the human report: what was traced, the per-process
// table, the stacks holding the most memory and the failed allocations.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeHeader(ew)
	fmt.Fprintln(ew)
	if ew.err == nil {
		ew.err = writeProcesses(ew, r.Processes)
	}
	comm := map[uint32]string{}
	for _, p := range r.Processes {
		comm[p.PID] = p.Comm
	}
	r.writeStacks(ew, comm)
	r.writeFailures(ew, comm)
	if ew.err != nil {
		return fmt.Errorf("write report: %w", ew.err)
	}
	return nil
}

func (r *Report) writeHeader(w io.Writer) {
	t := r.Trace
	what := ""
	switch {
	case len(t.Command) > 0:
		what = strings.Join(t.Command, " ") + " "
	case t.All:
		what = "all processes "
	case len(t.PIDs) > 0:
		what = fmt.Sprintf("pids %v ", t.PIDs)
	}
	start := "an unknown time"
	if !t.Start.IsZero() {
		start = t.Start.Format("2006-01-02 15:04:05 MST")
	}
	d := time.Duration(t.DurationNS)
	if d >= time.Second {
		d = d.Round(time.Millisecond)
	}
	fmt.Fprintf(w, "Trace %s: %son %s, %s from %s, %d events, %d lost\n", t.Path, what, orUnknown(t.Host),
		d, start, r.Events, r.LostEvents)
	if r.LostEvents > 0 {
		var why []string
		for _, c := range []string{"ringbuf_full", "inflight_full", "no_entry", "stale_entry"} {
			if n := r.Counters[c]; n > 0 {
				why = append(why, fmt.Sprintf("%s %d", c, n))
			}
		}
		because := ""
		if len(why) > 0 {
			because = " (" + strings.Join(why, ", ") + ")"
		}
		fix := ""
		if r.Counters["ringbuf_full"] > 0 {
			fix = "; raise --ring-size and record again"
		}
		fmt.Fprintf(w, "WARNING: %d EVENTS WERE LOST%s: every figure below may be off%s\n", r.LostEvents, because, fix)
	}
	if r.Warning != "" {
		fmt.Fprintf(w, "Warning: %s\n", r.Warning)
	}
	var uncaptured []string
	for _, p := range r.Processes {
		if p.CaptureError != "" {
			uncaptured = append(uncaptured, fmt.Sprint(p.PID))
		}
	}
	if len(uncaptured) > 0 {
		who := "1 process"
		if len(uncaptured) > 1 {
			who = fmt.Sprintf("%d processes", len(uncaptured))
		}
		fmt.Fprintf(w, "Note: %s exited before cudatrace could read the mappings (pid %s): their stacks show addresses only\n",
			who, strings.Join(uncaptured, ", "))
	}
}

func (r *Report) writeStacks(w io.Writer, comm map[uint32]string) {
	if len(r.Stacks) == 0 {
		return
	}
	top := r.top
	if top <= 0 {
		top = DefaultTop
	}
	n := min(top, len(r.Stacks))
	fmt.Fprintf(w, "\nTop stacks by live bytes (%d of %d):\n", n, len(r.Stacks))
	for i, s := range r.Stacks[:n] {
		fmt.Fprintf(w, "\n[%d] %s live in %s; %s allocated in %s; pid %d (%s)\n", i+1,
			HumanBytes(s.LiveBytes), plural(s.LiveCount, "allocation"), HumanBytes(s.AllocBytes),
			plural(s.Allocs, "call"), s.PID, comm[s.PID])
		writeFrames(w, s.Frames)
	}
}

// writeFailures prints failed calls grouped by process, function and error,
// each group with the stack of its first call.
func (r *Report) writeFailures(w io.Writer, comm map[uint32]string) {
	if len(r.Failures) == 0 {
		return
	}
	type key struct {
		pid      uint32
		api, err string
	}
	type group struct {
		key
		n, bytes uint64
		first    *Failure
	}
	var groups []*group
	index := map[key]*group{}
	for i := range r.Failures {
		f := &r.Failures[i]
		k := key{f.PID, f.API, f.Error}
		g := index[k]
		if g == nil {
			g = &group{key: k, first: f}
			index[k] = g
			groups = append(groups, g)
		}
		g.n++
		g.bytes += f.Size
	}
	slices.SortStableFunc(groups, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.pid, b.pid), cmp.Compare(b.n, a.n))
	})
	fmt.Fprintf(w, "\nFailed allocations (%s):\n", plural(uint64(len(r.Failures)), "call"))
	for _, g := range groups {
		fmt.Fprintf(w, "\n%d × %s in pid %d (%s): %s (%d), %s requested in all; the first from:\n",
			g.n, g.api, g.pid, comm[g.pid], g.err, g.first.Result, HumanBytes(g.bytes))
		writeFrames(w, g.first.Frames)
	}
}

// writeFrames prints a stack as "  #0 function (file:line) module", the
// address standing in for an unknown function.
func writeFrames(w io.Writer, frames []Frame) {
	if len(frames) == 0 {
		fmt.Fprintln(w, "  (no stack)")
		return
	}
	for i, f := range frames {
		var b strings.Builder
		fmt.Fprintf(&b, "  #%d ", i)
		if f.Function != "" {
			b.WriteString(f.Function)
		} else {
			b.WriteString(f.Address)
		}
		if f.File != "" {
			fmt.Fprintf(&b, " (%s:%d)", f.File, f.Line)
		}
		if f.Module != "" {
			b.WriteString(" " + filepath.Base(f.Module))
			if f.Function == "" && f.Offset != 0 {
				fmt.Fprintf(&b, "+%#x", f.Offset)
			}
		}
		fmt.Fprintln(w, b.String())
	}
}

func plural(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown host"
	}
	return s
}

// errWriter keeps the first write error, so the text is written without
// checking every Fprintf.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
