package report

// diff_ranks.go: two runs of a distributed job side by side, rank by
// rank. A rank's PID, node and job ID change from run to run; its rank
// does not. Where each trace holds one job the ranks are matched by
// number; with several, by the job's name (or ID) and number.

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"

	"github.com/cudatrace/cudatrace/internal/units"
)

// RankDelta is one rank's memory in A and B.
type RankDelta struct {
	Job  string `json:"job,omitempty"` // where the traces hold several jobs: its name, else its ID
	Rank int    `json:"rank"`
	Peak Delta  `json:"peak_bytes"`
	Live Delta  `json:"live_bytes"`
	// OnlyIn is "a" or "b" for a rank one trace does not have.
	OnlyIn string `json:"only_in,omitempty"`
}

type rankKey struct {
	job  string
	rank int
}

func rankDeltas(a, b *Report) []RankDelta {
	if len(a.Jobs) == 0 || len(b.Jobs) == 0 {
		return nil
	}
	byJob := len(a.Jobs) > 1 || len(b.Jobs) > 1
	type sums struct {
		peak, live [2]uint64
		in         [2]bool
	}
	by := map[rankKey]*sums{}
	var keys []rankKey
	for i, r := range []*Report{a, b} {
		for _, j := range r.Jobs {
			name := ""
			if byJob {
				name = cmp.Or(j.Name, j.ID)
			}
			for _, rk := range j.Ranks {
				k := rankKey{name, rk.Rank}
				s := by[k]
				if s == nil {
					s = &sums{}
					by[k] = s
					keys = append(keys, k)
				}
				s.peak[i] += rk.PeakBytes
				s.live[i] += rk.LiveBytes
				s.in[i] = true
			}
		}
	}
	slices.SortFunc(keys, func(x, y rankKey) int { return cmp.Or(cmp.Compare(x.job, y.job), cmp.Compare(x.rank, y.rank)) })
	out := make([]RankDelta, 0, len(keys))
	for _, k := range keys {
		s := by[k]
		d := RankDelta{Job: k.job, Rank: k.rank, Peak: delta(s.peak[0], s.peak[1]), Live: delta(s.live[0], s.live[1])}
		switch {
		case !s.in[0]:
			d.OnlyIn = "b"
		case !s.in[1]:
			d.OnlyIn = "a"
		}
		out = append(out, d)
	}
	return out
}

// writeRanks prints the ranks' table.
func (d *Diff) writeRanks(w io.Writer) {
	if len(d.Ranks) == 0 {
		return
	}
	fmt.Fprintf(w, "\nBy rank:\n\n")
	jobs := slices.ContainsFunc(d.Ranks, func(r RankDelta) bool { return r.Job != "" })
	t := &table{right: []bool{true, true, true, true, true, true, true, false}}
	head := []string{"RANK", "PEAK A", "PEAK B", "CHANGE", "END A", "END B", "CHANGE", ""}
	if jobs {
		t.right = append([]bool{false}, t.right...)
		head = append([]string{"JOB"}, head...)
	}
	t.add(head...)
	for _, r := range d.Ranks {
		note := ""
		if r.OnlyIn != "" {
			note = "only in " + r.OnlyIn
		}
		row := []string{strconv.Itoa(r.Rank), units.Bytes(r.Peak.A), units.Bytes(r.Peak.B), signed(r.Peak.Delta),
			units.Bytes(r.Live.A), units.Bytes(r.Live.B), signed(r.Live.Delta), note}
		if jobs {
			row = append([]string{r.Job}, row...)
		}
		t.add(row...)
	}
	_ = t.write(w)
}
