package export

// jobs.go: the processes of distributed jobs in the exports: their job,
// rank and node as labels of the profiles (job_id, rank, node, as on the
// agent's metrics), as the titles of the timeline's processes (rank 3 ·
// node-b · pid 4242, ordered by rank), and as the way to pick one
// process's memory snapshot (--rank).

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/replay"
)

// JobLabels adds c's job_id and rank (each where known) and node (a
// merged trace's) to labels, and returns it (a new map for nil).
func JobLabels(labels map[string]string, c *procmodel.Capture) map[string]string {
	if labels == nil {
		labels = map[string]string{}
	}
	if c == nil {
		return labels
	}
	if id := c.JobID(); id != "" {
		labels["job_id"] = id
	}
	if c.Ranked() {
		labels["rank"] = strconv.Itoa(c.Rank())
	}
	if c.Node != "" {
		labels["node"] = c.Node
	}
	return labels
}

// pickOne says how to choose one of pids, processes of t: each PID, with
// its rank and node where it has them.
func pickOne(t *replay.Trace, pids []uint32) string {
	s := make([]string, len(pids))
	ranked := false
	for i, pid := range pids {
		s[i] = strconv.FormatUint(uint64(pid), 10)
		if c := t.First(pid); c.Ranked() || c != nil && c.Node != "" {
			s[i] += " (" + procmodel.Title(c, pid, "") + ")"
			ranked = ranked || c.Ranked()
		}
	}
	how := "--pid"
	if ranked {
		how = "--pid or --rank"
	}
	return fmt.Sprintf("choose one with %s (%s)", how, strings.Join(s, ", "))
}
