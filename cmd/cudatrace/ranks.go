package main

// ranks.go: choosing a trace's processes by their rank in a distributed
// job (--rank, --job), and --pid for the verbs that read a trace, which
// takes the numbers a merged trace gives processes above the kernel's
// PID limit.

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/internal/hint"
	"github.com/cudatrace/cudatrace/replay"
)

// tracePIDs is --pid of the verbs that read a trace: a process ID, or
// one of the numbers above 4194304 (the kernel's PID_MAX_LIMIT) a merged
// trace gives the processes whose PID another node had.
//
// NODE:PID names a merged trace's process as its node knew it (how report
// shows one the merge renumbered): selection finds its number.
type tracePIDs struct {
	pidList
	onNode []nodePID
}

type nodePID struct {
	node string
	pid  uint32
}

func (p *tracePIDs) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		node, num, onNode := strings.Cut(f, ":")
		if !onNode {
			num = f
		}
		v, err := strconv.ParseUint(num, 10, 32)
		if err != nil || v == 0 || onNode && node == "" {
			return fmt.Errorf("not a process ID (want a whole number from 1 to %d, or NODE:PID in a merged trace)", uint32(math.MaxUint32))
		}
		if onNode {
			p.onNode = append(p.onNode, nodePID{node, uint32(v)})
			continue
		}
		p.pidList = append(p.pidList, uint32(v))
	}
	return nil
}

// selection is the PIDs the flags choose in trace: --pid's, and the
// processes of the --rank ranks (of --job). Empty: every process.
func (f *readFlags) selection(trace string) ([]uint32, error) {
	pids := slices.Clone(f.pids.pidList)
	if len(f.ranks) == 0 && len(f.pids.onNode) == 0 {
		if f.job != "" {
			return nil, hint.Wrap(errors.New("--job chooses the job of --rank"), "add --rank N")
		}
		return pids, nil
	}
	procs, err := replay.Processes(trace)
	if err != nil {
		return nil, err
	}
	for _, np := range f.pids.onNode {
		found := false
		for pid, c := range procs {
			if c.Node == np.node && (c.NodePID == np.pid || c.NodePID == 0 && pid == np.pid) {
				pids, found = append(pids, pid), true
			}
		}
		if !found {
			return nil, hint.Wrap(fmt.Errorf("--pid %s:%d: no such process in the trace", np.node, np.pid), "report lists its processes, with their node")
		}
	}
	if len(f.ranks) == 0 {
		if f.job != "" {
			return nil, hint.Wrap(errors.New("--job chooses the job of --rank"), "add --rank N")
		}
		return pids, nil
	}
	jobs := map[string]bool{}
	have := map[string][]int{} // what the trace has: each job's ranks
	found := map[int]bool{}
	for _, pid := range slices.Sorted(maps.Keys(procs)) {
		c := procs[pid]
		if !c.Ranked() {
			continue
		}
		have[c.JobID()] = append(have[c.JobID()], c.Rank())
		if f.job != "" && c.JobID() != f.job {
			continue
		}
		jobs[c.JobID()] = true
		if slices.Contains(f.ranks, c.Rank()) {
			pids = append(pids, pid)
			found[c.Rank()] = true
		}
	}
	if len(have) == 0 {
		return nil, hint.Wrap(errors.New("--rank: no process of the trace has a rank"), "choose processes with --pid")
	}
	if _, ok := have[f.job]; f.job != "" && !ok {
		var says []string
		for _, job := range slices.Sorted(maps.Keys(have)) {
			says = append(says, jobName(job))
		}
		return nil, hint.Wrap(fmt.Errorf("--job %s: no such job in the trace", f.job), "its jobs: "+strings.Join(says, ", "))
	}
	if len(jobs) > 1 {
		return nil, hint.Wrap(fmt.Errorf("--rank: the trace has %d jobs", len(jobs)), "say which with --job ("+
			strings.Join(slices.Sorted(maps.Keys(jobs)), ", ")+")")
	}
	for _, r := range f.ranks {
		if !found[r] {
			var says []string
			for _, job := range slices.Sorted(maps.Keys(have)) {
				says = append(says, "ranks "+spans(have[job])+" of "+jobName(job))
			}
			return nil, hint.Wrap(fmt.Errorf("rank %d is not in the trace", r), "the trace has "+strings.Join(says, "; "))
		}
	}
	return pids, nil
}

// spans writes numbers as runs: 0-3, 5, 7-9.
func spans(ns []int) string {
	ns = slices.Compact(slices.Sorted(slices.Values(ns)))
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ns[i]))
		} else {
			parts = append(parts, strconv.Itoa(ns[i])+"-"+strconv.Itoa(ns[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

func jobName(job string) string {
	if job == "" {
		return "an unnamed job"
	}
	return job
}
