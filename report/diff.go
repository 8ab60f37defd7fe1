package report

// diff.go: two traces side by side (cudatrace diff), for CI: the peak, the
// memory live at the end, and per owner and per stack, what changed. The
// two runs' addresses differ (ASLR, another build), so stacks are matched
// by their symbolized frames.

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/pystack"
)

// Diff is what changed from trace A to trace B. Figures are summed over
// each trace's processes (a trace of one job: its process's own).
type Diff struct {
	A string `json:"a"`
	B string `json:"b"`
	// PeakBytes is the processes' GPU memory at their peaks, LiveBytes at
	// the end of the trace.
	PeakBytes Delta `json:"peak_bytes"`
	LiveBytes Delta `json:"live_bytes"`
	// Owners, by owner name (package owner), every device together.
	Owners []OwnerDelta `json:"owners"`
	// Stacks, matched by their frames, the most changed first; unchanged
	// ones are left out.
	Stacks []StackDelta `json:"stacks"`
	// Unchanged counts the stacks in both traces with the same figures.
	Unchanged int `json:"unchanged_stacks"`
	// Ranks, where both traces are of distributed jobs, are each rank's
	// peak and end memory, matched by rank (diff_ranks.go).
	Ranks []RankDelta `json:"ranks,omitempty"`
}

// Delta is one figure in A and B, and B less A.
type Delta struct {
	A     uint64 `json:"a"`
	B     uint64 `json:"b"`
	Delta int64  `json:"delta"`
}

func delta(a, b uint64) Delta { return Delta{A: a, B: b, Delta: int64(b) - int64(a)} }

// OwnerDelta is one owner's memory at the end and at the peak.
type OwnerDelta struct {
	Owner string `json:"owner"`
	Live  Delta  `json:"live_bytes"`
	Peak  Delta  `json:"peak_bytes"`
}

// StackDelta is one call path's memory live at the end, at the peak, and
// allocated in all.
type StackDelta struct {
	Live   Delta   `json:"live_bytes"`
	Peak   Delta   `json:"peak_bytes"`
	Alloc  Delta   `json:"alloc_bytes"`
	Frames []Frame `json:"frames"` // B's, or A's for a stack only A has
}

// LoadDiff loads both traces (every stack at the peak) and compares them.
func LoadDiff(a, b string, opts Options) (*Diff, error) {
	opts.Top = math.MaxInt32 // every stack at the peak, to match them all
	ra, err := Load(a, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", a, err)
	}
	rb, err := Load(b, opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b, err)
	}
	return NewDiff(ra, rb), nil
}

// NewDiff compares two reports.
func NewDiff(a, b *Report) *Diff {
	d := &Diff{A: a.Trace.Path, B: b.Trace.Path, Owners: []OwnerDelta{}, Stacks: []StackDelta{}}
	sum := func(r *Report) (peak, live uint64) {
		for _, p := range r.Processes {
			peak += p.PeakBytes
			live += p.LiveBytes
		}
		return peak, live
	}
	pa, la := sum(a)
	pb, lb := sum(b)
	d.PeakBytes, d.LiveBytes = delta(pa, pb), delta(la, lb)

	type ownerSums struct{ live, peak [2]uint64 }
	owners := map[string]*ownerSums{}
	for i, r := range []*Report{a, b} {
		for _, po := range r.Owners {
			for _, rows := range []struct {
				s    []OwnerShare
				peak bool
			}{{po.End, false}, {po.Peak, true}} {
				for _, s := range rows.s {
					o := owners[s.Owner]
					if o == nil {
						o = &ownerSums{}
						owners[s.Owner] = o
					}
					if rows.peak {
						o.peak[i] += s.LiveBytes
					} else {
						o.live[i] += s.LiveBytes
					}
				}
			}
		}
	}
	for name, o := range owners {
		d.Owners = append(d.Owners, OwnerDelta{Owner: name, Live: delta(o.live[0], o.live[1]), Peak: delta(o.peak[0], o.peak[1])})
	}
	slices.SortFunc(d.Owners, func(x, y OwnerDelta) int {
		return cmp.Or(cmp.Compare(abs(y.Peak.Delta)+abs(y.Live.Delta), abs(x.Peak.Delta)+abs(x.Live.Delta)), cmp.Compare(x.Owner, y.Owner))
	})

	type stackSums struct {
		live, peak, alloc [2]uint64
		frames            []Frame
	}
	stacks := map[string]*stackSums{}
	var order []string
	at := func(frames []Frame) *stackSums {
		k := frameKey(frames)
		s := stacks[k]
		if s == nil {
			s = &stackSums{}
			stacks[k] = s
			order = append(order, k)
		}
		s.frames = frames // B's win: it is read second
		return s
	}
	for i, r := range []*Report{a, b} {
		for _, st := range r.Stacks {
			s := at(st.Frames)
			s.live[i] += st.LiveBytes
			s.alloc[i] += st.AllocBytes
		}
		for _, st := range r.PeakStacks {
			at(st.Frames).peak[i] += st.LiveBytes
		}
	}
	for _, k := range order {
		s := stacks[k]
		sd := StackDelta{Live: delta(s.live[0], s.live[1]), Peak: delta(s.peak[0], s.peak[1]),
			Alloc: delta(s.alloc[0], s.alloc[1]), Frames: s.frames}
		if sd.Live.Delta == 0 && sd.Peak.Delta == 0 && sd.Alloc.Delta == 0 {
			d.Unchanged++
			continue
		}
		d.Stacks = append(d.Stacks, sd)
	}
	slices.SortStableFunc(d.Stacks, func(x, y StackDelta) int {
		return cmp.Or(cmp.Compare(abs(y.Peak.Delta)+abs(y.Live.Delta), abs(x.Peak.Delta)+abs(x.Live.Delta)),
			cmp.Compare(abs(y.Alloc.Delta), abs(x.Alloc.Delta)))
	})
	d.Ranks = rankDeltas(a, b)
	return d
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// frameKey names a call path the same in two runs: a Python frame by its
// file, line and function, a named native frame by its file's name and
// function, an unnamed one by its file's name and offset in it (the same
// in another run of the same build, wherever it was mapped), and where
// its file could not be read (no offset) by its address, which matches
// only where both runs mapped it alike. The process is left out: the
// runs' PIDs differ.
func frameKey(frames []Frame) string {
	var b strings.Builder
	for _, f := range frames {
		switch {
		case f.Module == pystack.Module:
			fmt.Fprintf(&b, "py %s:%d %s\x00", f.File, f.Line, f.Function)
		case f.Function != "":
			fmt.Fprintf(&b, "%s %s\x00", filepath.Base(f.Module), f.Function)
		case f.Module != "" && f.Offset != 0:
			fmt.Fprintf(&b, "%s+%#x\x00", filepath.Base(f.Module), f.Offset)
		default:
			fmt.Fprintf(&b, "%s\x00", f.Address)
		}
	}
	return b.String()
}

// WriteJSON writes d as indented JSON.
func (d *Diff) WriteJSON(w io.Writer) error { return writeJSON(w, d, "diff") }

// WriteText writes d for a person: the totals, the owners, and the top
// changed stacks.
func (d *Diff) WriteText(w io.Writer, top int) error {
	ew := &errWriter{w: w}
	fmt.Fprintf(ew, "GPU memory, %s (A) -> %s (B):\n\n", d.A, d.B)
	t := &table{right: []bool{false, true, true, true}}
	t.add("", "A", "B", "CHANGE")
	t.add("peak", units.Bytes(d.PeakBytes.A), units.Bytes(d.PeakBytes.B), signed(d.PeakBytes.Delta))
	t.add("live at end", units.Bytes(d.LiveBytes.A), units.Bytes(d.LiveBytes.B), signed(d.LiveBytes.Delta))
	_ = t.write(ew)
	if len(d.Owners) > 0 {
		fmt.Fprintf(ew, "\nBy owner:\n\n")
		t = &table{right: []bool{false, true, true, true, true, true, true}}
		t.add("OWNER", "PEAK A", "PEAK B", "CHANGE", "END A", "END B", "CHANGE")
		for _, o := range d.Owners {
			t.add(o.Owner, units.Bytes(o.Peak.A), units.Bytes(o.Peak.B), signed(o.Peak.Delta),
				units.Bytes(o.Live.A), units.Bytes(o.Live.B), signed(o.Live.Delta))
		}
		_ = t.write(ew)
	}
	d.writeRanks(ew)
	n := min(top, len(d.Stacks))
	if n == 0 {
		fmt.Fprintf(ew, "\nNo stack changed (%d in both).\n", d.Unchanged)
	} else {
		fmt.Fprintf(ew, "\nStacks that changed (%d of %d; %d unchanged):\n", n, len(d.Stacks), d.Unchanged)
	}
	for i, s := range d.Stacks[:n] {
		fmt.Fprintf(ew, "\n[%d] at the peak %s (%s -> %s); live at end %s (%s -> %s); allocated %s\n", i+1,
			signed(s.Peak.Delta), units.Bytes(s.Peak.A), units.Bytes(s.Peak.B),
			signed(s.Live.Delta), units.Bytes(s.Live.A), units.Bytes(s.Live.B), signed(s.Alloc.Delta))
		writeFrames(ew, s.Frames)
	}
	if ew.err != nil {
		return fmt.Errorf("write diff: %w", ew.err)
	}
	return nil
}

// signed is a byte change with its sign: +128.0 MiB, -4.0 KiB, 0 B.
func signed(v int64) string {
	switch {
	case v > 0:
		return "+" + units.Bytes(uint64(v))
	case v < 0:
		return "-" + units.Bytes(uint64(-v))
	}
	return "0 B"
}
