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
// "python3, rank 3, node-b" ("…, node-b:4242" where the merge renumbered
// it, as everywhere: pidText).
func (p *Process) label() string {
	parts := []string{p.Comm}
	if p.Job != nil && p.Job.Rank != nil {
		parts = append(parts, "rank "+strconv.Itoa(*p.Job.Rank))
	}
	switch {
	case p.Node != "" && p.NodePID != 0:
		parts = append(parts, pidText(p.PID, p.Node, p.NodePID))
	case p.Node != "":
		parts = append(parts, p.Node)
	}
	return strings.Join(parts, ", ")
}

// pidText is how a job's text names a process: its PID, or, where the
// merge renumbered it (another node had its PID), NODE:PID as its node
// knew it, which --pid takes as well as the merged number.
func pidText(pid uint32, node string, nodePID uint32) string {
	if nodePID != 0 {
		return node + ":" + strconv.FormatUint(uint64(nodePID), 10)
	}
	return strconv.FormatUint(uint64(pid), 10)
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
		name := j.ID
		if j.ID == "" {
			// Nothing in the environment names it (MPICH's and Intel
			// MPI's Hydra set PMI_RANK alone).
			name = "without an ID"
			if j.Launcher != "" {
				name += " (" + j.Launcher + " ranks: their launcher sets none)"
			}
			if j.Unnamed > 1 || slices.ContainsFunc(r.Jobs, func(o Job) bool { return o.ID == "" && o.Unnamed > 1 }) {
				name = fmt.Sprintf("#%d %s", j.Unnamed, name)
			}
		}
		if j.Name != "" && !strings.HasSuffix(j.ID, ":"+j.Name) {
			name += " (" + j.Name + ")"
		}
		if j.Attempt != nil {
			name += fmt.Sprintf(", attempt %d", *j.Attempt)
			if *j.Attempt > 0 {
				name += fmt.Sprintf(" (restarted %s by torchrun)", times(*j.Attempt))
			}
		}
		of := ""
		if j.WorldSize > 0 {
			of = fmt.Sprintf(" of %d", j.WorldSize)
		}
		on := ""
		if len(j.Nodes) > 0 {
			on = fmt.Sprintf(" on %s (%s)", plural(uint64(len(j.Nodes)), "node"), strings.Join(j.Nodes, ", "))
		}
		shown := plural(uint64(len(j.Ranks)), "rank") + of
		if ranked := len(j.Ranks); ranked < j.TracedRanks {
			shown = fmt.Sprintf("%s shown of the %d traced%s (the others left out by --rank or --pid)", plural(uint64(ranked), "rank"),
				j.TracedRanks, strings.Replace(of, " of", ", world size", 1))
		}
		fmt.Fprintf(w, "\nJob %s: %s%s\n", name, shown, on)
		if j.Missing > 0 {
			fmt.Fprintf(w, "Note: %s not traced: %s\n", wasWere(j.Missing, "rank"), intList(j.MissingRanks, j.Missing))
		}
		for _, d := range j.Duplicates {
			pids := make([]string, len(d.PIDs))
			for i, p := range d.PIDs {
				pids[i] = strconv.FormatUint(uint64(p), 10)
			}
			fmt.Fprintf(w, "WARNING: rank %d is %d processes' (pids %s): started twice (a batch script that runs its tasks without srun gives each SLURM_PROCID 0), or two jobs nothing tells apart; each is listed\n",
				d.Rank, len(d.PIDs), strings.Join(pids, ", "))
		}
		if len(j.Ranks) == 0 {
			continue
		}
		fmt.Fprintln(w)
		t := table{right: []bool{true, false, true, true, true, true}}
		t.add("RANK", "NODE", "PID", "PEAK", "LIVE", "FAILED")
		for _, rk := range j.Ranks {
			t.add(strconv.Itoa(rk.Rank), rk.Node, pidText(rk.PID, rk.Node, rk.NodePID), units.Bytes(rk.PeakBytes), units.Bytes(rk.LiveBytes), fmt.Sprint(rk.Failed))
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
			who := "pid " + pidText(f.PID, f.Node, f.NodePID)
			if f.Rank != nil {
				who = fmt.Sprintf("rank %d (pid %s)", *f.Rank, pidText(f.PID, f.Node, f.NodePID))
			}
			at := ""
			if when, err := time.Parse(time.RFC3339Nano, f.Time); err == nil {
				at = " at " + when.Format("15:04:05.000000 MST")
			}
			first := "First failure in the job"
			if len(f.CutShort) > 0 {
				first = "First failure seen in the job"
			}
			fmt.Fprintf(w, "\n%s: %s on %s, %s into the trace%s: %s of %s on gpu %s failed: %s (%d)\n",
				first, who, orUnknown(f.Node), roundAge(time.Duration(f.AfterNS)), at, f.API, units.Bytes(f.Size),
				events.DeviceName(f.Device), f.Error, f.Result)
			for _, c := range f.CutShort {
				fmt.Fprintf(w, "WARNING: the trace of %s stops %s into the trace, before this failure (%s): a failure of its ranks after that is not seen, so this may not be the job's first\n",
					orUnknown(c.Host), roundAge(time.Duration(c.EndNS)), cmp.Or(c.Warning, "cut short"))
			}
			writeFrames(w, f.Frames)
			fmt.Fprintln(w, "What each of the job's processes held then:")
			before := slices.ContainsFunc(f.Held, func(h Held) bool { return h.BeforeBytes > 0 })
			t := table{right: []bool{true, false, true, true, before, false}}
			if before {
				t.add("RANK", "NODE", "PID", "LIVE", "BEFORE TRACING", "")
			} else {
				t.add("RANK", "NODE", "PID", "LIVE", "")
			}
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
				if before {
					b := ""
					if h.BeforeBytes > 0 {
						b = units.Bytes(h.BeforeBytes)
					}
					t.add(rank, h.Node, pidText(h.PID, h.Node, h.NodePID), units.Bytes(h.LiveBytes), b, note)
				} else {
					t.add(rank, h.Node, pidText(h.PID, h.Node, h.NodePID), units.Bytes(h.LiveBytes), note)
				}
			}
			if err := t.write(w); err != nil {
				fmt.Fprintf(w, "%v", err)
			}
			if n := len(f.RunningBefore); n > 0 {
				what := "their processes were"
				if n == 1 {
					what = "one of its processes was"
				}
				extra := ""
				if before {
					extra = "; BEFORE TRACING is what the driver (NVML) charged beyond the traced memory at its first sample, the CUDA context included"
				}
				fmt.Fprintf(w, "Note: tracing began while %s running (%d of %d: attached): LIVE is what each made since; memory made before is not in it%s\n",
					what, n, len(f.Held), extra)
			}
		}
	}
}

// wasWere says n things were: "rank 3 was", "3 ranks were".
func wasWere(n int, what string) string {
	if n == 1 {
		return "1 " + what + " was"
	}
	return fmt.Sprintf("%d %ss were", n, what)
}

// times writes a count of times: once, twice, 3 times.
func times(n int) string {
	switch n {
	case 1:
		return "once"
	case 2:
		return "twice"
	}
	return fmt.Sprintf("%d times", n)
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
