package report

// jobs_text.go: the text of jobs.go's models: the process table's NODE,
// JOB and RANK columns, the nodes of a merged trace and how their clocks
// align, and each job's ranks, imbalance and first failure.

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
)

// label names a process in the report's lines after its PID:
// "python3, rank 3, node-b" ("…, node-b pid 4242" where the merge
// renumbered it).
func (p *Process) label() string {
	parts := []string{p.Comm}
	if p.Job != nil && p.Job.Rank != nil {
		parts = append(parts, "rank "+strconv.Itoa(*p.Job.Rank))
	}
	switch {
	case p.Node != "" && p.NodePID != 0:
		parts = append(parts, fmt.Sprintf("%s pid %d", p.Node, p.NodePID))
	case p.Node != "":
		parts = append(parts, p.Node)
	}
	return strings.Join(parts, ", ")
}

// idColumns are the process table's identity columns present.
type idColumns struct{ node, job, rank bool }

func identityColumns(rows []Process) idColumns {
	var c idColumns
	for _, p := range rows {
		c.node = c.node || p.Node != ""
		c.job = c.job || p.Job != nil && p.Job.ID != ""
		c.rank = c.rank || p.Job != nil && p.Job.Rank != nil
	}
	return c
}

func (c idColumns) head(head []string, right []bool) ([]string, []bool) {
	for _, col := range []struct {
		on   bool
		name string
	}{{c.node, "NODE"}, {c.job, "JOB"}, {c.rank, "RANK"}} {
		if col.on {
			head, right = append(head, col.name), append(right, col.name == "RANK")
		}
	}
	return head, right
}

// cells adds p's identity cells to row (blank ones for p nil).
func (c idColumns) cells(row []string, p *Process) []string {
	var node, job, rank string
	if p != nil {
		node = p.Node
		if p.NodePID != 0 {
			node += ":" + strconv.FormatUint(uint64(p.NodePID), 10)
		}
		if p.Job != nil {
			job = p.Job.ID
			if p.Job.Rank != nil {
				rank = strconv.Itoa(*p.Job.Rank)
			}
		}
	}
	if c.node {
		row = append(row, node)
	}
	if c.job {
		row = append(row, job)
	}
	if c.rank {
		row = append(row, rank)
	}
	return row
}

// order groups the rows by job, ranks in order, after the processes in
// none (which keep their PID order).
func (c idColumns) order(rows []Process) []Process {
	if !c.job && !c.rank {
		return rows
	}
	out := slices.Clone(rows)
	key := func(p *Process) (int, string, int) {
		if p.Job == nil {
			return 0, "", 0
		}
		return 1, p.Job.ID, rankOr(p.Job.Rank)
	}
	slices.SortStableFunc(out, func(a, b Process) int {
		ga, ja, ra := key(&a)
		gb, jb, rb := key(&b)
		return cmp.Or(cmp.Compare(ga, gb), cmp.Compare(ja, jb), cmp.Compare(ra, rb), cmp.Compare(a.PID, b.PID))
	})
	return out
}

// where says where the trace was taken: its host, or its nodes.
func (r *Report) where() string {
	if len(r.Nodes) == 0 {
		return orUnknown(r.Trace.Host)
	}
	hosts := make([]string, len(r.Nodes))
	for i, n := range r.Nodes {
		hosts[i] = orUnknown(n.Host)
	}
	return fmt.Sprintf("%d nodes (%s)", len(r.Nodes), strings.Join(hosts, ", "))
}

// writeNodes says, for a merged trace, how its nodes' clocks were put on
// one timeline and how well that holds, and how each trace ended.
func (r *Report) writeNodes(w io.Writer) {
	if len(r.Nodes) == 0 {
		return
	}
	var unsynced, unknown []string
	for _, n := range r.Nodes {
		switch {
		case n.Synced == nil:
			unknown = append(unknown, orUnknown(n.Host))
		case !*n.Synced:
			unsynced = append(unsynced, orUnknown(n.Host))
		}
	}
	bound, ok := Alignment(r.Nodes)
	switch {
	case ok:
		fmt.Fprintf(w, "Clocks: each node's times are put on its wall clock; every node's was synchronized, so they align to within %s (the two largest clock errors and pairings)\n",
			roundAge(bound))
	case len(unsynced) == 1:
		fmt.Fprintf(w, "WARNING: the wall clock of %s was not synchronized (NTP, PTP) when its trace began: its times are placed by that clock, and may be off against the other nodes' by as much as it was\n",
			unsynced[0])
	case len(unsynced) > 1:
		fmt.Fprintf(w, "WARNING: the wall clocks of %s were not synchronized (NTP, PTP) when their traces began: their times are placed by those clocks, and may be off against each other by as much as they were\n",
			strings.Join(unsynced, ", "))
	}
	if len(unknown) > 0 {
		fmt.Fprintf(w, "Note: the traces of %s do not say how well their clocks were synchronized (recorded by an older cudatrace)\n",
			strings.Join(unknown, ", "))
	}
	for _, n := range r.Nodes {
		if n.Warning != "" {
			fmt.Fprintf(w, "Warning: %s (%s): %s\n", orUnknown(n.Host), n.Trace, n.Warning)
		}
	}
}

// writeJobs prints each job's ranks side by side, their imbalance, and
// the job's first failure with what every rank held then.
func (r *Report) writeJobs(w io.Writer) {
	for _, j := range r.Jobs {
		name := cmp.Or(j.ID, "a job no variable names")
		if j.Name != "" && !strings.HasSuffix(j.ID, ":"+j.Name) {
			name += " (" + j.Name + ")"
		}
		of := ""
		if j.WorldSize > 0 {
			of = fmt.Sprintf(" of %d", j.WorldSize)
		}
		on := ""
		if len(j.Nodes) > 0 {
			on = fmt.Sprintf(" on %s (%s)", plural(uint64(len(j.Nodes)), "node"), strings.Join(j.Nodes, ", "))
		}
		fmt.Fprintf(w, "\nJob %s: %d ranks%s%s\n", name, len(j.Ranks), of, on)
		if j.Missing > 0 {
			fmt.Fprintf(w, "Note: %s traced: %s\n", plural(uint64(j.Missing), "rank was not"), intList(j.MissingRanks, j.Missing))
		}
		if len(j.Ranks) == 0 {
			continue
		}
		fmt.Fprintln(w)
		t := table{right: []bool{true, false, true, true, true, true}}
		t.add("RANK", "NODE", "PID", "PEAK", "LIVE", "FAILED")
		for _, rk := range j.Ranks {
			pid := fmt.Sprint(rk.PID)
			if rk.NodePID != 0 {
				pid = fmt.Sprintf("%d (%d)", rk.NodePID, rk.PID)
			}
			t.add(strconv.Itoa(rk.Rank), rk.Node, pid, units.Bytes(rk.PeakBytes), units.Bytes(rk.LiveBytes), fmt.Sprint(rk.Failed))
		}
		if err := t.write(w); err != nil {
			fmt.Fprintf(w, "%v", err)
		}
		if len(j.Ranks) > 1 {
			p := j.Peak
			fmt.Fprintf(w, "Peak per rank: %s (rank %d) to %s (rank %d), mean %s: the highest is %.2f× the mean\n",
				units.Bytes(p.MinBytes), p.MinRank, units.Bytes(p.MaxBytes), p.MaxRank, units.Bytes(p.MeanBytes), p.Imbalance)
		}
		if f := j.FirstFailure; f != nil {
			who := fmt.Sprintf("pid %d", f.PID)
			if f.Rank != nil {
				who = fmt.Sprintf("rank %d (pid %d)", *f.Rank, cmp.Or(f.NodePID, f.PID))
			}
			at := ""
			if when, err := time.Parse(time.RFC3339Nano, f.Time); err == nil {
				at = " at " + when.Format("15:04:05.000000 MST")
			}
			fmt.Fprintf(w, "\nFirst failure in the job: %s on %s, %s into the trace%s: %s of %s on gpu %s failed: %s (%d)\n",
				who, orUnknown(f.Node), roundAge(time.Duration(f.AfterNS)), at, f.API, units.Bytes(f.Size),
				events.DeviceName(f.Device), f.Error, f.Result)
			writeFrames(w, f.Frames)
			fmt.Fprintln(w, "What each of the job's processes held then:")
			t := table{right: []bool{true, false, true, true, false}}
			t.add("RANK", "NODE", "PID", "LIVE", "")
			for _, h := range f.Held {
				rank, note := "-", ""
				if h.Rank != nil {
					rank = strconv.Itoa(*h.Rank)
				}
				switch {
				case h.PID == f.PID:
					note = "failed"
				case h.NotStarted:
					note = "no traced call yet"
				case h.Exited:
					note = "had exited"
				}
				t.add(rank, h.Node, fmt.Sprint(h.PID), units.Bytes(h.LiveBytes), note)
			}
			if err := t.write(w); err != nil {
				fmt.Fprintf(w, "%v", err)
			}
		}
	}
}

// intList writes the first of n numbers, and how many more.
func intList(shown []int, n int) string {
	s := make([]string, len(shown))
	for i, v := range shown {
		s[i] = strconv.Itoa(v)
	}
	if n > len(shown) {
		return strings.Join(s, ", ") + fmt.Sprintf(" and %d more", n-len(shown))
	}
	return strings.Join(s, ", ")
}
