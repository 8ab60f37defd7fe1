package export

import (
	"encoding/json"
	"fmt"

	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/replay"
)

// procName is a process of the timeline, before its title is known.
type procName struct {
	pid  uint32
	comm string
}

// names titles each process of the timeline (procmodel.Title: "rank 3 ·
// node-b · pid 4242" for a rank of a job, "python3 (4242)" otherwise),
// and orders the ranks of a job by rank (process_sort_index), so that the
// timeline of a job lists rank 0 first, whatever its PID or node.
func (tw *timelineWriter) names(t *replay.Trace) {
	for _, p := range tw.order {
		c := t.First(p.pid)
		name, _ := json.Marshal(procmodel.Title(c, p.pid, p.comm))
		tw.buf = fmt.Appendf(tw.buf[:0], `"ph":"M","name":"process_name","pid":%d,"tid":%d,"args":{"name":%s}`, p.pid, p.pid, name)
		tw.event(tw.buf)
		if c.Ranked() {
			tw.buf = fmt.Appendf(tw.buf[:0], `"ph":"M","name":"process_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}`,
				p.pid, p.pid, c.Rank())
			tw.event(tw.buf)
		}
	}
}
