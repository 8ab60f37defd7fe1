package report

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
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

// HumanBytes formats a byte count 1024-based: "512 B", "1.5 MiB".
func HumanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// WriteSummary prints one line per process of a ledger: what `record`
// prints when it stops.
func WriteSummary(w io.Writer, l *events.Ledger, lost uint64) error {
	var rows []Process
	for _, p := range l.Processes() {
		row := Process{PID: p.PID, Comm: p.Comm, Allocs: p.Allocs, Frees: p.Frees, Failed: p.Failed,
			AllocBytes: p.AllocBytes, LiveBytes: p.Live, PeakBytes: p.Peak, HostLiveBytes: p.HostLive}
		for _, d := range p.DeviceList() {
			row.Devices = append(row.Devices, Device{Device: d.Device, LiveBytes: d.Live, PeakBytes: d.Peak})
		}
		rows = append(rows, row)
	}
	return writeProcesses(w, rows, lost)
}

func writeProcesses(w io.Writer, rows []Process, lost uint64) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No CUDA allocation traced.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PID\tCOMM\tALLOCS\tFREES\tFAILED\tALLOCATED\tLIVE\tPEAK\tHOST LIVE\t")
	for _, p := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", p.PID, p.Comm, p.Allocs, p.Frees, p.Failed,
			HumanBytes(p.AllocBytes), HumanBytes(p.LiveBytes), HumanBytes(p.PeakBytes), HumanBytes(p.HostLiveBytes))
		if len(p.Devices) > 1 {
			for _, d := range p.Devices {
				fmt.Fprintf(tw, "\t  gpu %d\t\t\t\t\t%s\t%s\t\t\n", d.Device, HumanBytes(d.LiveBytes), HumanBytes(d.PeakBytes))
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	if lost > 0 {
		fmt.Fprintf(w, "WARNING: %d events were lost; the figures above miss them (raise --ring-size)\n", lost)
	}
	return nil
}

// WriteText writes the human report.
func (r *Report) WriteText(w io.Writer) error {
	t := r.Trace
	what := strings.Join(t.Command, " ")
	switch {
	case t.All:
		what = "all processes"
	case len(t.PIDs) > 0:
		what = fmt.Sprintf("pids %v", t.PIDs)
	}
	fmt.Fprintf(w, "Trace %s: %s on %s, %s, started %s, %s, %d events",
		t.Path, what, t.Host, t.Kernel, t.Start.Format(time.DateTime), time.Duration(t.DurationNS).Round(time.Millisecond), r.Events)
	if r.LostEvents > 0 {
		fmt.Fprintf(w, ", %d LOST (raise --ring-size)", r.LostEvents)
	}
	fmt.Fprintln(w)
	if r.Warning != "" {
		fmt.Fprintf(w, "Warning: %s\n", r.Warning)
	}
	fmt.Fprintln(w)
	if err := writeProcesses(w, r.Processes, 0); err != nil {
		return err
	}

	top := r.top
	if top <= 0 {
		top = DefaultTop
	}
	if len(r.Stacks) > 0 {
		n := min(top, len(r.Stacks))
		fmt.Fprintf(w, "\nTop %d of %d allocation stacks, by live bytes then bytes allocated:\n", n, len(r.Stacks))
		for _, s := range r.Stacks[:n] {
			fmt.Fprintf(w, "\n%s live in %s, %s allocated in %s, pid %d\n",
				HumanBytes(s.LiveBytes), count(s.LiveCount, "allocation"), HumanBytes(s.AllocBytes), count(s.Allocs, "call"), s.PID)
			writeFrames(w, s.Frames)
		}
	}

	if len(r.Failures) > 0 {
		type key struct {
			pid      uint32
			api, err string
		}
		type agg struct {
			n, bytes uint64
			result   int32
			first    *Failure
		}
		groups := map[key]*agg{}
		var order []key
		for i := range r.Failures {
			f := &r.Failures[i]
			k := key{f.PID, f.API, f.Error}
			g := groups[k]
			if g == nil {
				g = &agg{result: f.Result, first: f}
				groups[k] = g
				order = append(order, k)
			}
			g.n++
			g.bytes += f.Size
		}
		sort.SliceStable(order, func(i, j int) bool { return groups[order[i]].n > groups[order[j]].n })
		fmt.Fprintf(w, "\nFailed allocations (%d):\n", len(r.Failures))
		for _, k := range order {
			g := groups[k]
			fmt.Fprintf(w, "\n%d × %s failed with %s (%d), %s requested, pid %d; first from:\n",
				g.n, k.api, k.err, g.result, HumanBytes(g.bytes), k.pid)
			writeFrames(w, g.first.Frames)
		}
	}
	return nil
}

func writeFrames(w io.Writer, frames []Frame) {
	if len(frames) == 0 {
		fmt.Fprintln(w, "    (no stack)")
		return
	}
	for i, f := range frames {
		name := f.Function
		if name == "" {
			name = f.Address
		}
		loc := ""
		if f.File != "" {
			loc = fmt.Sprintf(" %s:%d", f.File, f.Line)
		}
		mod := ""
		if f.Module != "" {
			mod = " [" + baseName(f.Module) + "]"
		}
		fmt.Fprintf(w, "    #%-2d %s%s%s\n", i, name, loc, mod)
	}
}

func baseName(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

func count(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}
