package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return writeJSON(w, r, "report") }

// writeJSON writes v as indented JSON; what names it in the error.
func writeJSON(w io.Writer, v any, what string) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// WriteSummary prints the per-process table of a ledger: what `record`
// prints when it stops. lost is the count of events the BPF side dropped
// while tracing (those lost while stopping change none of its figures).
//
// captured gives each process's capture (nil: none, or none known), whose
// job, rank and node the rows show, as report's do.
func WriteSummary(w io.Writer, l *ledger.Ledger, lost uint64, captured func(pid uint32) *procmodel.Capture) error {
	var rows []Process
	for _, p := range l.Processes() {
		row := NewProcess(p, nil)
		if c := captured(p.PID); c != nil {
			row.Identify(c)
		}
		rows = append(rows, row)
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
	// Tensor columns only where a framework's allocator reported tensors.
	// A VMM-MAPPED column only where the driver's VMM API was used.
	// An IMPLICIT-FREED column (allocations freed with their context:
	// count and bytes) only where a context died holding memory.
	// A HELD-AT-EXIT column (GPU memory a process held when it ended,
	// released then) only where one ended holding some.
	tensors, vmm, implicit, held := false, false, false, false
	for _, p := range rows {
		tensors = tensors || p.TensorAllocs > 0
		vmm = vmm || p.VMMMaps > 0
		implicit = implicit || p.ImplicitFrees > 0
		held = held || p.HeldAtExitAllocs > 0
	}
	// NODE (a merged trace), JOB and RANK (processes of distributed
	// jobs, grouped by job) where some process has them (jobs_text.go).
	ids := identityColumns(rows)
	rows = ids.order(rows)
	t := table{}
	head := []string{"PID", "COMM"}
	t.right = []bool{true, false}
	head, t.right = ids.head(head, t.right)
	head = append(head, "ALLOCS", "FREES", "FAILED", "ALLOCATED", "LIVE", "PEAK", "HOST-LIVE")
	t.right = append(t.right, true, true, true, true, true, true, true)
	if tensors {
		head = append(head, "TENSOR-LIVE", "TENSOR-PEAK")
	}
	if vmm {
		head = append(head, "VMM-MAPPED")
	}
	if implicit {
		head = append(head, "IMPLICIT-FREED")
	}
	if held {
		head = append(head, "HELD-AT-EXIT")
	}
	for len(t.right) < len(head) {
		t.right = append(t.right, true)
	}
	t.add(head...)
	for _, p := range rows {
		row := ids.cells([]string{fmt.Sprint(p.PID), p.Comm}, &p)
		row = append(row, fmt.Sprint(p.Allocs), fmt.Sprint(p.Frees), fmt.Sprint(p.Failed),
			units.Bytes(p.AllocBytes), units.Bytes(p.LiveBytes), units.Bytes(p.PeakBytes), units.Bytes(p.HostLiveBytes))
		if tensors {
			row = append(row, units.Bytes(p.TensorLiveBytes), units.Bytes(p.TensorPeakBytes))
		}
		if vmm {
			row = append(row, units.Bytes(p.VMMMappedBytes))
		}
		if implicit {
			row = append(row, fmt.Sprintf("%d (%s)", p.ImplicitFrees, units.Bytes(p.ImplicitFreeBytes)))
		}
		if held {
			row = append(row, fmt.Sprintf("%d (%s)", p.HeldAtExitAllocs, units.Bytes(p.HeldAtExitBytes)))
		}
		t.add(row...)
		if len(p.Devices) > 1 || len(p.Devices) == 1 && p.Devices[0].Unknown {
			for _, d := range p.Devices {
				row := ids.cells([]string{"", "  gpu " + events.DeviceName(d.Device)}, nil)
				row = append(row, "", "", "", "", units.Bytes(d.LiveBytes), units.Bytes(d.PeakBytes), "")
				if tensors {
					row = append(row, units.Bytes(d.TensorLiveBytes), units.Bytes(d.TensorPeakBytes))
				}
				if vmm {
					row = append(row, "")
				}
				if implicit {
					row = append(row, fmt.Sprintf("%d (%s)", d.ImplicitFrees, units.Bytes(d.ImplicitFreeBytes)))
				}
				if held {
					row = append(row, fmt.Sprintf("%d (%s)", d.HeldAtExitAllocs, units.Bytes(d.HeldAtExitBytes)))
				}
				t.add(row...)
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
		comm[p.PID] = p.label()
	}
	r.writeJobs(ew)
	r.writeNVML(ew, comm)
	r.writeOwners(ew, comm)
	r.writeStacks(ew, comm)
	r.writePeaks(ew, comm)
	r.writeLeaks(ew, comm)
	r.writeFailures(ew, comm)
	r.writeIntervals(ew, comm)
	r.writeView(ew, comm)
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
	lost := fmt.Sprintf("%d lost", r.LostEvents)
	if r.LostStopping > 0 {
		lost = fmt.Sprintf("%d lost while tracing, %d while stopping", r.LostEvents-r.LostStopping, r.LostStopping)
	}
	fmt.Fprintf(w, "Trace %s: %son %s, %s from %s, %d events, %s\n", t.Path, what, r.where(),
		d, start, r.Events, lost)
	if n := r.LostEvents - r.LostStopping; n > 0 {
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
		fmt.Fprintf(w, "WARNING: %d EVENTS WERE LOST%s: every figure below may be off%s\n", n, because, fix)
	}
	if n := r.Counters["ringbuf_no_window"]; n > 0 {
		fmt.Fprintf(w, "Note: %d allocations were recorded without their stack windows (the reader was behind by more than half the ring buffer in a burst): each is in every figure below, its native frames from frame pointers alone (shallower where code has none); a larger --ring-size keeps them\n", n)
	}
	if r.LostStopping > 0 {
		fmt.Fprintf(w, "Note: %d events were lost while the recording stopped (probes firing as they were removed): the figures up to the stop miss none of them\n",
			r.LostStopping)
	}
	if r.Warning != "" {
		fmt.Fprintf(w, "Warning: %s\n", r.Warning)
	}
	if r.SymbolWarning != "" {
		fmt.Fprintf(w, "Warning: %s\n", r.SymbolWarning)
	}
	r.writeNodes(w)
	for _, l := range r.Libraries {
		switch {
		case l.LatePID != 0 && l.LoadedNS != 0:
			fmt.Fprintf(w, "Note: pid %d loaded %s after tracing began, %s into the trace, and its probes were attached %s later: calls into it in between, if it made any, were not traced\n",
				l.LatePID, l.Path, roundAge(time.Duration(l.LoadedNS)), time.Duration(l.LateNS-min(l.LoadedNS, l.LateNS)).Round(10*time.Microsecond))
		case l.LatePID != 0:
			fmt.Fprintf(w, "Note: pid %d loaded %s after tracing began; a scan of its mappings found it %s into the trace and attached it then: its calls into it before then were not traced, and how many there were cannot be known\n",
				l.LatePID, l.Path, roundAge(time.Duration(l.LateNS)))
		}
	}
	for _, p := range r.Processes {
		if p.UnresolvedPythonFrames > 0 {
			fmt.Fprintf(w, "Note: %d of pid %d's %s stayed unresolved (their code objects were gone before cudatrace read them): shown as [unresolved Python frame]\n",
				p.UnresolvedPythonFrames, p.PID, plural(uint64(p.PythonFrames), "Python frame"))
		}
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
	n := min(r.topN(), len(r.Stacks))
	fmt.Fprintf(w, "\nTop stacks by live bytes (%d of %d):\n", n, len(r.Stacks))
	for i, s := range r.Stacks[:n] {
		segments := fmt.Sprintf("%s live in %s; %s allocated in %s", units.Bytes(s.LiveBytes),
			plural(s.LiveCount, "allocation"), units.Bytes(s.AllocBytes), plural(s.Allocs, "call"))
		var what string
		switch {
		case s.TensorAllocs == 0:
			what = segments
		case s.Allocs == 0:
			what = fmt.Sprintf("tensors: %s live in %d; %s used in %s", units.Bytes(s.TensorLiveBytes),
				s.TensorLiveCount, units.Bytes(s.TensorAllocBytes), plural(s.TensorAllocs, "call"))
		default: // both levels: the tensors it used beside the segments it acquired for them
			what = fmt.Sprintf("tensors: %s live in %d; %s used in %s | segments: %s live in %d; %s acquired in %s",
				units.Bytes(s.TensorLiveBytes), s.TensorLiveCount, units.Bytes(s.TensorAllocBytes), plural(s.TensorAllocs, "call"),
				units.Bytes(s.LiveBytes), s.LiveCount, units.Bytes(s.AllocBytes), plural(s.Allocs, "call"))
		}
		fmt.Fprintf(w, "\n[%d] %s; pid %d (%s)\n", i+1, what, s.PID, comm[s.PID])
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
			g.n, g.api, g.pid, comm[g.pid], g.err, g.first.Result, units.Bytes(g.bytes))
		writeFrames(w, g.first.Frames)
		f := g.first
		fmt.Fprintf(w, "  when it failed, pid %d held %s of GPU memory, %s of it on gpu %s", f.PID,
			units.Bytes(f.LiveBytes), units.Bytes(f.DeviceLiveBytes), events.DeviceName(f.Device))
		if len(f.LiveStacks) == 0 {
			fmt.Fprintln(w)
			continue
		}
		fmt.Fprintln(w, ", most from:")
		for i, s := range f.LiveStacks {
			fmt.Fprintf(w, "  (%c) %s in %s:\n", 'a'+i, units.Bytes(s.LiveBytes), plural(s.LiveCount, "allocation"))
			writeFramesIndent(w, s.Frames, "    ")
		}
	}
}

// writePeaks prints, per process, the stacks that held its GPU memory at
// its peak: they are what to shrink to lower it.
func (r *Report) writePeaks(w io.Writer, comm map[uint32]string) {
	peak := map[uint32]Process{}
	for _, p := range r.Processes {
		peak[p.PID] = p
	}
	last := uint32(0)
	n := 0
	for i, s := range r.PeakStacks {
		if i == 0 || s.PID != last {
			last, n = s.PID, 0
			p := peak[s.PID]
			when := ""
			if at, err := time.Parse(time.RFC3339Nano, p.PeakTime); err == nil && !r.Trace.Start.IsZero() {
				when = fmt.Sprintf(" (%s into the trace)", roundAge(at.Sub(r.Trace.Start)))
			}
			fmt.Fprintf(w, "\nAt its peak%s, pid %d (%s) held %s of GPU memory, from:\n", when, s.PID, comm[s.PID],
				units.Bytes(p.PeakBytes))
		}
		n++
		fmt.Fprintf(w, "\n[%d] %s in %s\n", n, units.Bytes(s.LiveBytes), plural(s.LiveCount, "allocation"))
		writeFrames(w, s.Frames)
	}
}

// writeLeaks prints the leak candidates, as bcc's memleak does: old
// allocations still live, by stack.
func (r *Report) writeLeaks(w io.Writer, comm map[uint32]string) {
	if r.MinAgeNS == 0 {
		return
	}
	age := time.Duration(r.MinAgeNS)
	if len(r.Leaks) == 0 {
		fmt.Fprintf(w, "\nLeak candidates: none (nothing live at the end is older than %s)\n", age)
		return
	}
	n := min(len(r.Leaks), r.topN())
	fmt.Fprintf(w, "\nLeak candidates, live at the end and older than %s (%d of %d stacks):\n", age, n, len(r.Leaks))
	host := false
	for i, l := range r.Leaks[:n] {
		what := ""
		if l.Host {
			what, host = " of pinned host memory", true
		}
		fmt.Fprintf(w, "\n[%d] %s%s in %s, the oldest %s old; pid %d (%s)\n", i+1, units.Bytes(l.LiveBytes), what,
			plural(l.LiveCount, "allocation"), roundAge(time.Duration(l.OldestAgeNS)), l.PID, comm[l.PID])
		writeFrames(w, l.Frames)
	}
	if host {
		fmt.Fprintln(w, "\nPinned host memory (cudaHostAlloc and the like) is host memory the driver keeps page-locked, not GPU memory: the process table's LIVE leaves it out (HOST-LIVE has it).")
	}
}

// roundAge keeps three or four significant digits of a duration.
func roundAge(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(time.Microsecond)
	}
	return d
}

// writeIntervals prints the --interval table: per process, device and
// interval, the change in live bytes and the peak above it.
func (r *Report) writeIntervals(w io.Writer, comm map[uint32]string) {
	if r.IntervalNS == 0 {
		return
	}
	fmt.Fprintf(w, "\nGPU memory per %s (USED: change over the interval; PEAKED: how far above both ends it rose):\n\n",
		time.Duration(r.IntervalNS))
	if len(r.Intervals) == 0 {
		fmt.Fprintln(w, "No GPU memory allocated.")
		return
	}
	t := table{right: []bool{true, false, true, true, true, true, true}}
	t.add("PID", "COMM", "GPU", "FROM", "USED", "PEAKED", "LIVE")
	for _, iv := range r.Intervals {
		used := units.Bytes(uint64(iv.Used))
		if iv.Used < 0 {
			used = "-" + units.Bytes(uint64(-iv.Used))
		} else if iv.Used > 0 {
			used = "+" + used
		}
		t.add(fmt.Sprint(iv.PID), comm[iv.PID], events.DeviceName(iv.Device), time.Duration(iv.StartNS).String(), used,
			units.Bytes(iv.Peaked), units.Bytes(iv.LiveEnd))
	}
	if err := t.write(w); err != nil {
		fmt.Fprintf(w, "%v", err) // errWriter keeps the error
	}
}

func (r *Report) topN() int {
	if r.top <= 0 {
		return DefaultTop
	}
	return r.top
}

// writeFrames prints a stack as "  #0 function (file:line) module", the
// address standing in for an unknown function.
func writeFrames(w io.Writer, frames []Frame) { writeFramesIndent(w, frames, "  ") }

func writeFramesIndent(w io.Writer, frames []Frame, indent string) {
	if len(frames) == 0 {
		fmt.Fprintln(w, indent+"(no stack)")
		return
	}
	for i, f := range frames {
		var b strings.Builder
		fmt.Fprintf(&b, "%s#%d ", indent, i)
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

// writeView prints the --by table: per function or line, tensor bytes
// used and segment bytes acquired, the calls, what is live of each, and
// with --interval the bytes added (+) and removed (-) per interval.
func (r *Report) writeView(w io.Writer, comm map[uint32]string) {
	if r.By == "" {
		return
	}
	fmt.Fprintf(w, "\nBy %s (USED: tensors from the framework's pool; ACQUIRED: segments from the device; a stack counts in every %s it passes through):\n\n", r.By, r.By)
	if len(r.View) == 0 {
		fmt.Fprintln(w, "No GPU memory allocated.")
		return
	}
	t := table{right: []bool{true, false, true, true, true, true, true, false}}
	t.add("PID", "COMM", "USED", "ACQUIRED", "OCCURRENCES", "USED-LIVE", "ACQUIRED-LIVE", strings.ToUpper(string(r.By)))
	for _, v := range r.View[:min(len(r.View), r.topN())] {
		t.add(fmt.Sprint(v.PID), comm[v.PID], units.Bytes(v.UsedBytes), units.Bytes(v.AcquiredBytes), fmt.Sprint(v.Occurrences),
			units.Bytes(v.UsedLiveBytes), units.Bytes(v.AcquiredLiveBytes), v.Key)
	}
	if err := t.write(w); err != nil {
		fmt.Fprintf(w, "%v", err)
		return
	}
	if r.IntervalNS == 0 {
		return
	}
	fmt.Fprintf(w, "\nAdded (+) and removed (-) per %s and %s:\n\n", time.Duration(r.IntervalNS), r.By)
	t = table{right: []bool{true, true, true, true, false}}
	t.add("PID", "FROM", "ADDED", "REMOVED", strings.ToUpper(string(r.By)))
	for _, v := range r.View[:min(len(r.View), r.topN())] {
		for _, iv := range v.Intervals {
			t.add(fmt.Sprint(v.PID), (time.Duration(iv.Index) * time.Duration(r.IntervalNS)).String(),
				"+"+units.Bytes(iv.AddedBytes), "-"+units.Bytes(iv.RemovedBytes), v.Key)
		}
	}
	if err := t.write(w); err != nil {
		fmt.Fprintf(w, "%v", err)
	}
}
