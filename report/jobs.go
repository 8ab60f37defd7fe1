package report

// jobs.go: processes as the ranks of distributed jobs. Each process's job
// and rank come from its environment (package jobid, read when it was
// first seen); a trace merged from several nodes (cudatrace merge) holds
// every node's processes, each with its host. A job's report is its ranks'
// figures side by side, how unevenly they used memory, the first failure
// in the job (the rank that ran out first: its node, time and stack) and
// what every rank of the job held at that moment.

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/replay"
)

// ProcessJob is a process's place in a distributed job. Rank, LocalRank
// and NodeRank are absent when unknown (0 is a rank).
type ProcessJob struct {
	// ID names the job, the same for every process of it on every node
	// ("slurm:4242.0", "torchrun:…", "mpi:…", "jobset:…", "ray:…",
	// "torch:ADDR:PORT"); "" when the process has a rank but nothing
	// names its job.
	ID        string   `json:"id"`
	Name      string   `json:"name,omitempty"`     // the scheduler's name for it
	Launcher  string   `json:"launcher,omitempty"` // what gave the rank
	Role      string   `json:"role,omitempty"`
	Rank      *int     `json:"rank,omitempty"`
	LocalRank *int     `json:"local_rank,omitempty"`
	WorldSize int      `json:"world_size,omitempty"`
	NodeRank  *int     `json:"node_rank,omitempty"`
	Attempt   *int     `json:"attempt,omitempty"` // an elastic job's (torchrun's restart count)
	Vars      []string `json:"vars,omitempty"`    // the environment variables it was read from
}

// Identify fills p's job, rank and node from its capture (the agent's OOM
// dumps too).
func (p *Process) Identify(c *procmodel.Capture) {
	p.JobError, p.Node, p.NodePID = c.JobError, c.Node, c.NodePID
	id := c.Job
	if !id.Known() {
		return
	}
	opt := func(n int) *int {
		if n < 0 {
			return nil
		}
		return &n
	}
	p.Job = &ProcessJob{ID: id.Job, Name: id.Name, Launcher: id.Launcher, Role: id.Role, Rank: opt(id.Rank),
		LocalRank: opt(id.LocalRank), WorldSize: id.WorldSize, NodeRank: opt(id.NodeRank), Attempt: opt(id.Attempt()), Vars: id.Vars}
}

// Job is one distributed job's processes, ranks side by side.
type Job struct {
	ID        string   `json:"id"`
	Name      string   `json:"name,omitempty"`
	Launcher  string   `json:"launcher,omitempty"`
	WorldSize int      `json:"world_size,omitempty"` // as the ranks' environment says
	Nodes     []string `json:"nodes,omitempty"`      // the hosts its ranks ran on
	Ranks     []Rank   `json:"ranks"`                // by rank, then PID
	// MissingRanks are ranks below world_size no traced process had
	// (the first 64 of them; Missing counts them all).
	MissingRanks []int `json:"missing_ranks,omitempty"`
	Missing      int   `json:"missing,omitempty"`
	// Unranked are the job's processes without a rank (a Ray driver).
	Unranked []uint32 `json:"unranked_pids,omitempty"`
	// Attempt is an elastic job's attempt (torchrun's restart count: each
	// restart of the workers is a job of its own here); Unnamed numbers
	// the jobs nothing names (1, 2…: the same launcher's ranks seen again).
	Attempt *int `json:"attempt,omitempty"`
	Unnamed int  `json:"unnamed,omitempty"`
	// TracedRanks counts the ranks the trace has of the job, listed in
	// Ranks or left out by --rank or --pid.
	TracedRanks int `json:"traced_ranks"`
	// Duplicates are ranks more than one process of the job had: started
	// twice (a batch script running its tasks without srun gives each
	// SLURM_PROCID 0), or a job the environment does not tell apart.
	Duplicates []DuplicateRank `json:"duplicate_ranks,omitempty"`
	// Peak and Live are the ranks' peak and end GPU memory side by side.
	Peak Spread `json:"peak"`
	Live Spread `json:"live"`
	// FirstFailure is the job's first failed allocation, in time across
	// its ranks and nodes; nil when none failed.
	FirstFailure *JobFailure `json:"first_failure,omitempty"`
}

// DuplicateRank is a rank several processes had.
type DuplicateRank struct {
	Rank int      `json:"rank"`
	PIDs []uint32 `json:"pids"`
}

// Rank is one rank's figures.
type Rank struct {
	Rank      int    `json:"rank"`
	LocalRank *int   `json:"local_rank,omitempty"`
	PID       uint32 `json:"pid"`
	NodePID   uint32 `json:"node_pid,omitempty"`
	Node      string `json:"node"`
	Comm      string `json:"comm"`
	LiveBytes uint64 `json:"live_bytes"` // GPU memory at the end (at its exit, if it ended)
	PeakBytes uint64 `json:"peak_bytes"`
	PeakTime  string `json:"peak_time,omitempty"`
	Failed    uint64 `json:"failed"`
	Exited    bool   `json:"exited,omitempty"`
}

// Spread is one figure across a job's ranks: the least, the most, the
// mean, and how far the most is above the mean (Imbalance: most / mean;
// 1 for ranks alike, 0 with nothing allocated).
type Spread struct {
	MinBytes  uint64  `json:"min_bytes"`
	MinRank   int     `json:"min_rank"`
	MaxBytes  uint64  `json:"max_bytes"`
	MaxRank   int     `json:"max_rank"`
	MeanBytes uint64  `json:"mean_bytes"`
	Imbalance float64 `json:"imbalance"`
}

// JobFailure is a job's first failed allocation, and what each of the
// job's processes held at that moment.
type JobFailure struct {
	Rank    *int   `json:"rank,omitempty"` // absent for a process without one
	PID     uint32 `json:"pid"`
	NodePID uint32 `json:"node_pid,omitempty"`
	Node    string `json:"node"`
	Failure
	AfterNS uint64 `json:"after_ns"` // since the start of the trace
	// Held is every process of the job at the failure's moment, by rank:
	// the GPU memory it held (the failing one's included).
	Held []Held `json:"held"`
	// CutShort are the job's nodes whose traces stopped short before the
	// failure: a failure there after their end is not seen, so this is the
	// first failure seen, not surely the job's first.
	CutShort []CutNode `json:"cut_short,omitempty"`
	// RunningBefore are the job's processes that ran before tracing began
	// (an attach): memory they made before it is in no traced figure.
	RunningBefore []uint32 `json:"running_before,omitempty"`
}

// CutNode is a node whose trace stopped short, and where (its last event,
// since the start of the trace).
type CutNode struct {
	Host    string `json:"host"`
	Warning string `json:"warning,omitempty"`
	EndNS   uint64 `json:"end_ns"`
}

// Held is what one process of a job held at a moment.
type Held struct {
	Rank      *int   `json:"rank,omitempty"`
	PID       uint32 `json:"pid"`
	NodePID   uint32 `json:"node_pid,omitempty"`
	Node      string `json:"node"`
	LiveBytes uint64 `json:"live_bytes"`
	// BeforeBytes is what the driver (NVML) charged a process that ran
	// before tracing began beyond its traced memory, at its first sample:
	// its memory made before the trace, its context included.
	BeforeBytes uint64 `json:"before_bytes,omitempty"`
	// NotStarted: it had made no traced call yet; Exited: it had
	// already ended (what it held was released then).
	NotStarted bool `json:"not_started,omitempty"`
	Exited     bool `json:"exited,omitempty"`
}

// Node is one trace of a merged trace: its host, when it began, how its
// clock was put on the merged one, and how it ended.
type Node struct {
	Host        string    `json:"host"`
	Trace       string    `json:"trace"`
	Start       time.Time `json:"start"`
	OffsetNS    int64     `json:"offset_ns"`     // added to its boot-clock times
	ClockPairNS uint64    `json:"clock_pair_ns"` // its clocks were paired within this
	// Synced is whether its wall clock was synchronized (NTP, PTP) at
	// its start, absent where the trace does not say; EstErrorNS the
	// kernel's estimate of that clock's error then.
	Synced     *bool  `json:"synced,omitempty"`
	EstErrorNS uint64 `json:"est_error_ns,omitempty"`
	MaxErrorNS uint64 `json:"max_error_ns,omitempty"`
	Events     uint64 `json:"events"`
	Lost       uint64 `json:"lost_events"`
	Complete   bool   `json:"complete"`
	Warning    string `json:"warning,omitempty"`
}

// nodes lists a merged trace's nodes; nil for a trace of one host.
func nodes(t *replay.Trace) []Node {
	var out []Node
	for i, n := range t.Meta.Nodes {
		o := Node{Host: n.Host, Trace: n.Trace, Start: n.StartWall, OffsetNS: n.Offset, ClockPairNS: n.ClockPair}
		if n.Clock != nil {
			o.Synced, o.EstErrorNS, o.MaxErrorNS = &n.Clock.Synced, n.Clock.EstError, n.Clock.MaxError
		}
		if t.End != nil && i < len(t.End.Nodes) {
			e := t.End.Nodes[i]
			o.Events, o.Lost, o.Complete, o.Warning = e.Events, e.Lost, e.Complete, e.Warning
		} else {
			o.Warning = "the merged trace does not say how this trace ended"
		}
		out = append(out, o)
	}
	return out
}

// Alignment says how closely a merged trace's nodes' times line up: the
// merged clock is each node's wall clock, so two nodes agree to within
// the sum of their clocks' errors and half of each pairing. ok is false
// when some node's clock was not synchronized, or did not say.
func Alignment(ns []Node) (bound time.Duration, ok bool) {
	if len(ns) == 0 {
		return 0, false
	}
	var worst [2]uint64 // the two largest errors
	ok = true
	for _, n := range ns {
		if n.Synced == nil || !*n.Synced {
			ok = false
		}
		e := n.EstErrorNS + n.ClockPairNS/2
		switch {
		case e > worst[0]:
			worst[1], worst[0] = worst[0], e
		case e > worst[1]:
			worst[1] = e
		}
	}
	return time.Duration(worst[0] + worst[1]), ok
}

// jobMember is a process of the trace in a job, selected for the report
// or not: a job's ranks traced are the trace's, whatever --rank chose.
type jobMember struct {
	pid      uint32
	job      *ProcessJob
	start    uint64
	selected *Process // nil: left out by --pid or --rank
}

// jobKey is a job of the report: its ID and, for an elastic job, its
// attempt (torchrun restarts its workers with the same run ID); jobs
// without an ID are told apart by their launcher and world size, and a
// rank seen again begins another (unnamed numbers them).
type jobKey struct {
	id       string
	attempt  int
	launcher string
	world    int
	unnamed  int
}

// buildJobs groups the trace's processes by job, lists the selected ones
// as its ranks, and finds each job's first failure and what its processes
// held then (another pass over the trace, up to that moment). last is each
// process's latest event (a cut-short node's end).
func buildJobs(t *replay.Trace, rep *Report, frames func(*ledger.Stack) []Frame, last map[uint32]uint64) ([]Job, error) {
	selected := map[uint32]*Process{}
	for i := range rep.Processes {
		selected[rep.Processes[i].PID] = &rep.Processes[i]
	}
	var all []jobMember
	for _, lp := range t.Ledger.Processes() {
		c := t.First(lp.PID)
		if c == nil || !c.Job.Known() {
			continue
		}
		var tmp Process
		tmp.Identify(c)
		if sp := selected[lp.PID]; sp != nil {
			tmp = *sp
		}
		all = append(all, jobMember{pid: lp.PID, job: tmp.Job, start: c.Start, selected: selected[lp.PID]})
	}
	slices.SortStableFunc(all, func(a, b jobMember) int { return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(a.pid, b.pid)) })
	byKey := map[jobKey]*Job{}
	var keys []jobKey
	type unnamedGroup struct {
		key   jobKey
		ranks map[int]bool
	}
	var unnamed []*unnamedGroup
	members := map[jobKey][]*Process{}
	traced := map[jobKey]map[int][]uint32{} // rank -> its processes, in the whole trace
	for _, m := range all {
		k := jobKey{id: m.job.ID, attempt: -1}
		if m.job.Attempt != nil {
			k.attempt = *m.job.Attempt
		}
		if k.id == "" {
			// Nothing names the job (Hydra's PMI_RANK alone): by
			// launcher and world size, a rank seen again is another job.
			k.launcher, k.world = m.job.Launcher, m.job.WorldSize
			var g *unnamedGroup
			for _, u := range unnamed {
				if u.key.launcher == k.launcher && u.key.world == k.world && u.key.attempt == k.attempt &&
					(m.job.Rank == nil || !u.ranks[*m.job.Rank]) {
					g = u
					break
				}
			}
			if g == nil {
				k.unnamed = len(unnamed) + 1
				g = &unnamedGroup{key: k, ranks: map[int]bool{}}
				unnamed = append(unnamed, g)
			}
			k = g.key
			if m.job.Rank != nil {
				g.ranks[*m.job.Rank] = true
			}
		}
		j := byKey[k]
		if j == nil {
			j = &Job{ID: k.id, Ranks: []Rank{}, Unnamed: k.unnamed}
			if k.attempt >= 0 {
				a := k.attempt
				j.Attempt = &a
			}
			byKey[k] = j
			keys = append(keys, k)
			traced[k] = map[int][]uint32{}
		}
		j.Name = cmp.Or(j.Name, m.job.Name)
		j.Launcher = cmp.Or(j.Launcher, m.job.Launcher)
		j.WorldSize = max(j.WorldSize, m.job.WorldSize)
		if m.job.Rank != nil {
			traced[k][*m.job.Rank] = append(traced[k][*m.job.Rank], m.pid)
		}
		p := m.selected
		if p == nil {
			continue
		}
		node := cmp.Or(p.Node, t.Meta.Host)
		if !slices.Contains(j.Nodes, node) && node != "" {
			j.Nodes = append(j.Nodes, node)
		}
		members[k] = append(members[k], p)
		if p.Job.Rank == nil {
			j.Unranked = append(j.Unranked, p.PID)
			continue
		}
		j.Ranks = append(j.Ranks, Rank{Rank: *p.Job.Rank, LocalRank: p.Job.LocalRank, PID: p.PID, NodePID: p.NodePID,
			Node: node, Comm: p.Comm, LiveBytes: p.LiveBytes, PeakBytes: p.PeakBytes, PeakTime: p.PeakTime,
			Failed: p.Failed, Exited: p.Exited})
	}
	out := make([]Job, 0, len(keys))
	for _, k := range keys {
		j := byKey[k]
		if len(members[k]) == 0 {
			continue // every process of it left out by --pid or --rank
		}
		slices.Sort(j.Nodes)
		slices.SortFunc(j.Ranks, func(a, b Rank) int { return cmp.Or(cmp.Compare(a.Rank, b.Rank), cmp.Compare(a.PID, b.PID)) })
		j.TracedRanks = len(traced[k])
		for _, r := range slices.Sorted(maps.Keys(traced[k])) {
			if pids := traced[k][r]; len(pids) > 1 {
				j.Duplicates = append(j.Duplicates, DuplicateRank{Rank: r, PIDs: pids})
			}
		}
		j.missing(traced[k])
		j.Peak = spread(j.Ranks, func(r Rank) uint64 { return r.PeakBytes })
		j.Live = spread(j.Ranks, func(r Rank) uint64 { return r.LiveBytes })
		if err := j.firstFailure(t, rep, members[k], frames, last); err != nil {
			return nil, err
		}
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b Job) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Unnamed, b.Unnamed), cmp.Compare(attemptOr(a.Attempt), attemptOr(b.Attempt)))
	})
	return out, nil
}

func attemptOr(a *int) int {
	if a == nil {
		return -1
	}
	return *a
}

// maxMissing bounds the missing ranks listed.
const maxMissing = 64

// missing lists the ranks below the world size that no process of the
// trace had (traced: the trace's ranks, selected or not).
func (j *Job) missing(traced map[int][]uint32) {
	if j.WorldSize <= 0 || j.WorldSize > 1<<20 {
		return
	}
	for r := range j.WorldSize {
		if len(traced[r]) == 0 {
			j.Missing++
			if len(j.MissingRanks) < maxMissing {
				j.MissingRanks = append(j.MissingRanks, r)
			}
		}
	}
}

func spread(ranks []Rank, v func(Rank) uint64) Spread {
	if len(ranks) == 0 {
		return Spread{MinRank: -1, MaxRank: -1}
	}
	s := Spread{MinBytes: v(ranks[0]), MinRank: ranks[0].Rank, MaxBytes: v(ranks[0]), MaxRank: ranks[0].Rank}
	var sum float64
	for _, r := range ranks {
		x := v(r)
		sum += float64(x)
		if x < s.MinBytes {
			s.MinBytes, s.MinRank = x, r.Rank
		}
		if x > s.MaxBytes {
			s.MaxBytes, s.MaxRank = x, r.Rank
		}
	}
	mean := sum / float64(len(ranks))
	s.MeanBytes = uint64(mean + 0.5)
	if mean > 0 {
		s.Imbalance = float64(s.MaxBytes) / mean
	}
	return s
}

// firstFailure finds the earliest failed call of the job's processes,
// and replays the trace up to it for what each of them held then.
func (j *Job) firstFailure(t *replay.Trace, rep *Report, procs []*Process, frames func(*ledger.Stack) []Frame, last map[uint32]uint64) error {
	var first *ledger.Failure
	var who *Process
	for _, p := range procs {
		lp := t.Ledger.Process(p.PID)
		if lp == nil {
			continue
		}
		for i := range lp.Failures {
			if f := &lp.Failures[i]; first == nil || f.Time < first.Time {
				first, who = f, p
			}
		}
	}
	if first == nil {
		return nil
	}
	jf := &JobFailure{PID: who.PID, NodePID: who.NodePID, Node: cmp.Or(who.Node, t.Meta.Host),
		Failure: NewFailure(who.PID, first, nil, t.Meta.WallTime, frames), Held: []Held{}}
	if who.Job.Rank != nil {
		jf.Rank = who.Job.Rank
	}
	if first.Time > t.Meta.StartBoot {
		jf.AfterNS = first.Time - t.Meta.StartBoot
	}
	// A node whose trace was cut short before this moment may have had
	// an earlier failure no one saw: this is the first seen, not surely
	// the job's first.
	for _, n := range rep.Nodes {
		if n.Complete {
			continue
		}
		var end uint64
		for _, p := range procs {
			if p.Node == n.Host {
				end = max(end, last[p.PID])
			}
		}
		if end < first.Time {
			jf.CutShort = append(jf.CutShort, CutNode{Host: n.Host, Warning: n.Warning, EndNS: end - min(end, t.Meta.StartBoot)})
		}
	}
	// Processes that ran before tracing began (an attach): what they
	// made before it is in no figure.
	for _, p := range procs {
		if c := t.First(p.PID); c != nil && runningBefore(&t.Meta, c.Start) {
			jf.RunningBefore = append(jf.RunningBefore, p.PID)
		}
	}
	then, err := replay.Read(t.Path, replay.Options{Until: first.Time, FramePointersOnly: true})
	if err != nil {
		return fmt.Errorf("the ledger at the job's first failure: %w", err)
	}
	for _, p := range procs {
		h := Held{Rank: p.Job.Rank, PID: p.PID, NodePID: p.NodePID, Node: cmp.Or(p.Node, t.Meta.Host)}
		if p.NVML != nil && p.NVML.HeldBeforeBytes > 0 {
			h.BeforeBytes = uint64(p.NVML.HeldBeforeBytes)
		}
		switch lp := then.Ledger.Process(p.PID); {
		case lp == nil:
			h.NotStarted = true
		case lp.Exited:
			h.Exited = true
		default:
			h.LiveBytes = lp.Live
		}
		jf.Held = append(jf.Held, h)
		if p.PID == who.PID {
			jf.LiveBytes = h.LiveBytes
			if lp := then.Ledger.Process(p.PID); lp != nil {
				if d := lp.Devices[first.Device]; d != nil {
					jf.DeviceLiveBytes = d.Live
				}
			}
		}
	}
	slices.SortFunc(jf.Held, func(a, b Held) int {
		return cmp.Or(cmp.Compare(rankOr(a.Rank), rankOr(b.Rank)), cmp.Compare(a.PID, b.PID))
	})
	j.FirstFailure = jf
	return nil
}

// rankOr orders processes without a rank after every rank.
func rankOr(r *int) int {
	if r == nil {
		return 1 << 30
	}
	return *r
}
