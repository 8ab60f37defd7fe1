package top

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/symbolize"
)

// View is what the screen shows besides the snapshot.
type View struct {
	Selected uint32 // the highlighted process
	Status   string // the last message from the tracer, or why it stopped
	Width    int
	Height   int
	Every    time.Duration
	Target   string // "all processes", "pid 4242"
	NVMLOff  bool   // --nvml=false
}

// Frames symbolizes a stack; top keeps one cache for the session.
type Frames func(st *Stack) []symbolize.Frame

// Screen returns the lines of the full-screen view, at most v.Height, each
// at most v.Width runes: a header, the devices, the processes with the
// selected one marked by ">", and the selected process's top stacks.
func Screen(s *Snapshot, v View, frames Frames) []string {
	var out []string
	add := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	add("cudatrace top: %s, every %s, %s elapsed, %d events, %d lost   q quit, j/k or arrows select",
		v.Target, v.Every, s.Elapsed.Round(time.Second), s.Events, s.Lost)
	switch {
	case s.NVMLError != "":
		add("%s", s.NVMLError)
	case v.NVMLOff:
		add("NVML: off (--nvml=false)")
	case !s.NVML:
		add("NVML: no sample yet")
	default:
		add("")
	}
	if len(s.Devices) > 0 {
		t := &table{right: []bool{true, true, true, true, true, true, false}}
		t.add("GPU", "TRACED", "PEAK", "NVML-USED", "REMAINDER", "TOTAL", "NAME")
		for _, d := range s.Devices {
			used, rem, total, name := "-", "-", "-", ""
			if d.NVML != nil {
				used, total, name = units.Bytes(d.NVML.Used), units.Bytes(d.NVML.Total), d.NVML.Name
				rem = units.SignedBytes(int64(d.NVML.Used) - int64(d.Live))
			}
			t.add(fmt.Sprint(d.Number), units.Bytes(d.Live), units.Bytes(d.Peak), used, rem, total, name)
		}
		out = append(out, t.lines()...)
		add("")
	}
	// JOB and RANK where some process has them (as report's columns).
	ranked := slices.ContainsFunc(s.Processes, func(p Process) bool { return p.Job != "" || p.Ranked })
	t := &table{right: []bool{false, true, false, true, true, true, true, true, true, true, false}}
	head := []string{" ", "PID", "COMM", "LIVE", "PEAK", "TENSORS", "NVML-USED", "REMAINDER", "ALLOCS/S", "BYTES/S", "MOST BY"}
	if ranked {
		t.right = slices.Insert(t.right, 3, false, true)
		head = slices.Insert(head, 3, "JOB", "RANK")
	}
	t.add(head...)
	var sel *Process
	for i := range s.Processes {
		p := &s.Processes[i]
		mark := " "
		if p.PID == v.Selected {
			mark, sel = ">", p
		}
		used, rem := "-", "-"
		if p.Listed {
			used, rem = units.Bytes(p.NVMLUsed), units.SignedBytes(p.Remainder())
		}
		tensors := "-"
		if p.TensorLive > 0 {
			tensors = units.Bytes(p.TensorLive)
		}
		most := "-"
		if len(p.Owners) > 0 {
			most = p.Owners[0].Owner
		}
		row := []string{mark, fmt.Sprint(p.PID), p.Comm, units.Bytes(p.Live), units.Bytes(p.Peak), tensors, used, rem,
			fmt.Sprintf("%.1f", p.AllocRate), units.Bytes(uint64(p.ByteRate)), most}
		if ranked {
			rank := ""
			if p.Ranked {
				rank = fmt.Sprint(p.Rank)
			}
			row = slices.Insert(row, 3, p.Job, rank)
		}
		t.add(row...)
	}
	out = append(out, t.lines()...)
	if len(s.Processes) == 0 {
		add("  no CUDA allocation traced yet")
	}
	if sel != nil && sel.Allocs == 0 && sel.Listed {
		add("")
		add("pid %d (%s): no allocation traced; NVML charges it %s: it allocated before tracing began, or through a library not probed (--lib)",
			sel.PID, sel.who(), units.Bytes(sel.NVMLUsed))
	} else if sel != nil {
		add("")
		add("pid %d (%s): %s of GPU memory live in %d allocations, peak %s; %d allocations, %s, since tracing began",
			sel.PID, sel.who(), units.Bytes(sel.Live), sel.LiveCount, units.Bytes(sel.Peak), sel.Allocs, units.Bytes(sel.AllocBytes))
		if len(sel.Owners) > 0 {
			by := make([]string, len(sel.Owners))
			for i, o := range sel.Owners {
				by[i] = o.Owner + " " + units.Bytes(o.Live)
			}
			add("by owner: %s", strings.Join(by, ", "))
		}
		if s.StacksPID == sel.PID {
			for i, st := range s.Stacks {
				what := ""
				if st.Tensor {
					what = "tensors: "
				}
				add("[%d] %s%s live in %d allocation%s", i+1, what, units.Bytes(st.Live), st.LiveCount, plural(st.LiveCount))
				for j, f := range frames(&st) {
					add("    #%d %s", j, frameText(f))
				}
			}
		}
	}
	if v.Status != "" {
		// The status goes on the last line of the screen.
		for len(out) < v.Height-1 {
			out = append(out, "")
		}
		if len(out) >= v.Height && v.Height > 0 {
			out = out[:v.Height-1]
		}
		out = append(out, v.Status)
	}
	if v.Height > 0 && len(out) > v.Height {
		out = out[:v.Height]
	}
	for i, l := range out {
		out[i] = clip(l, v.Width)
	}
	return out
}

func frameText(f symbolize.Frame) string {
	var b strings.Builder
	if f.Function != "" {
		b.WriteString(f.Function)
	} else {
		fmt.Fprintf(&b, "%#x", f.Addr)
	}
	if f.File != "" {
		fmt.Fprintf(&b, " (%s:%d)", filepath.Base(f.File), f.Line)
	}
	if f.Module != "" {
		b.WriteString(" " + filepath.Base(f.Module))
	}
	return b.String()
}

func clip(s string, width int) string {
	if width <= 0 {
		return s
	}
	r := []rune(s)
	if len(r) > width {
		return string(r[:width])
	}
	return s
}

// WriteLines prints a snapshot as plain lines, one per process and one per
// device, key=value with exact byte counts, for a log or a pipe.
func WriteLines(w io.Writer, s *Snapshot, now time.Time) error {
	ts := now.UTC().Format(time.RFC3339)
	var b strings.Builder
	nvml := func(listed bool, used uint64, rem int64) string {
		if !listed {
			return "nvml_used=- remainder=-"
		}
		return fmt.Sprintf("nvml_used=%d remainder=%d", used, rem)
	}
	for _, d := range s.Devices {
		listed, used, total := d.NVML != nil, uint64(0), uint64(0)
		if listed {
			used, total = d.NVML.Used, d.NVML.Total
		}
		fmt.Fprintf(&b, "%s gpu=%d live=%d peak=%d %s", ts, d.Number, d.Live, d.Peak, nvml(listed, used, int64(used)-int64(d.Live)))
		if listed {
			fmt.Fprintf(&b, " total=%d", total)
		}
		b.WriteByte('\n')
	}
	for _, p := range s.Processes {
		fmt.Fprintf(&b, "%s pid=%d comm=%q live=%d peak=%d live_allocations=%d allocs=%d alloc_bytes=%d %s alloc_rate=%.1f byte_rate=%.0f",
			ts, p.PID, p.Comm, p.Live, p.Peak, p.LiveCount, p.Allocs, p.AllocBytes, nvml(p.Listed, p.NVMLUsed, p.Remainder()),
			p.AllocRate, p.ByteRate)
		if len(p.Owners) > 0 {
			by := make([]string, len(p.Owners))
			for i, o := range p.Owners {
				by[i] = fmt.Sprintf("%s:%d", o.Owner, o.Live)
			}
			fmt.Fprintf(&b, " owners=%s", strings.Join(by, ","))
		}
		b.WriteByte('\n')
	}
	if len(s.Processes) == 0 {
		fmt.Fprintf(&b, "%s no CUDA allocation traced yet (%d events, %d lost)\n", ts, s.Events, s.Lost)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// table lines up columns, each aligned left or right.
type table struct {
	right []bool
	rows  [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) lines() []string {
	width := make([]int, len(t.right))
	for _, row := range t.rows {
		for i, c := range row {
			if i < len(width) {
				width[i] = max(width[i], len([]rune(c)))
			}
		}
	}
	var out []string
	for _, row := range t.rows {
		var line strings.Builder
		for i, c := range row {
			if i > 0 {
				line.WriteString("  ")
			}
			pad := strings.Repeat(" ", max(0, width[i]-len([]rune(c))))
			if t.right[i] {
				line.WriteString(pad + c)
			} else {
				line.WriteString(c + pad)
			}
		}
		out = append(out, strings.TrimRight(line.String(), " "))
	}
	return out
}

func plural(n uint64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// who names p after its PID: its command, and its rank and job where it
// has them.
func (p *Process) who() string {
	switch {
	case p.Ranked && p.Job != "":
		return fmt.Sprintf("%s, rank %d of %s", p.Comm, p.Rank, p.Job)
	case p.Ranked:
		return fmt.Sprintf("%s, rank %d", p.Comm, p.Rank)
	case p.Job != "":
		return p.Comm + ", of " + p.Job
	}
	return p.Comm
}
