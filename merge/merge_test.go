package merge_test

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/tracefile"
)

// mergeFiles merges ins into a file and returns its path.
func mergeFiles(t *testing.T, ins ...string) (string, *merge.Result) {
	t.Helper()
	var in []merge.Input
	for _, p := range ins {
		in = append(in, merge.Input{Path: p})
	}
	var buf bytes.Buffer
	res, err := merge.Write(&buf, in, "cudatrace test")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "job.trace")
	if err := os.WriteFile(out, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return out, res
}

type rankOf struct {
	node    string
	nodePID uint32
	rank    int
}

// Two nodes' traces, their boot clocks hours apart, become one trace on
// the wall clock: PIDs both nodes had told apart, every process with its
// node, the events in time order, counters summed, each trace's end said.
func TestMerge(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	path, res := mergeFiles(t, a, b)
	if res.Renumbered != 1 || res.Events != 8 || len(res.Warnings) != 0 {
		t.Errorf("result %+v", res)
	}
	tr, err := replay.Read(path, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := tr.Meta
	// The merged clock reads node b's boot clock (the larger once both
	// are put at their wall-clock starts), from node b's start.
	if !m.StartWall.Equal(tracetest.Wall.Add(-time.Second)) || m.StartBoot != tracetest.BootB || m.Host != "" {
		t.Errorf("meta start %v boot %d host %q", m.StartWall, m.StartBoot, m.Host)
	}
	wantOff := []int64{int64(tracetest.BootB) + int64(time.Second) - int64(tracetest.BootA), 0}
	if len(m.Nodes) != 2 || m.Nodes[0].Host != "node-a" || m.Nodes[1].Host != "node-b" ||
		m.Nodes[0].Offset != wantOff[0] || m.Nodes[1].Offset != wantOff[1] || m.Nodes[0].Trace != a ||
		m.Nodes[1].ClockPair != 4000 || m.Nodes[0].Clock == nil || !m.Nodes[0].Clock.Synced {
		t.Errorf("nodes %+v, want node-a offset %d, node-b %d", m.Nodes, wantOff[0], wantOff[1])
	}
	// Node b's processes are seen first (it began a second earlier): its
	// pid 100 keeps its number, node a's is renumbered.
	want := map[uint32]rankOf{merge.FirstRenumbered: {"node-a", 100, 0}, 101: {"node-a", 0, 1}, 100: {"node-b", 0, 2},
		102: {"node-b", 0, 3}}
	got := map[uint32]rankOf{}
	for _, p := range tr.Ledger.Processes() {
		c := tr.First(p.PID)
		got[p.PID] = rankOf{c.Node, c.NodePID, c.Rank()}
		r := c.Rank()
		if p.Peak != tracetest.RankPeak[r] || p.Live != tracetest.RankLive[r] {
			t.Errorf("rank %d: peak %d live %d, want %d %d", r, p.Peak, p.Live, tracetest.RankPeak[r], tracetest.RankLive[r])
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("processes %+v, want %+v", got, want)
	}
	// Rank 2 (node b) failed at Wall+2s, rank 1 at Wall+2.5s.
	if f := tr.Ledger.Process(100).Failures; len(f) != 1 ||
		time.Duration(f[0].Time-m.StartBoot) != tracetest.FirstOOMAfter+10 {
		t.Errorf("rank 2's failure %+v, want %s after the start", f, tracetest.FirstOOMAfter)
	}
	if f := tr.Ledger.Process(101).Failures; len(f) != 1 || m.WallTime(f[0].Time) != tracetest.Wall.Add(2500*time.Millisecond+10) {
		t.Errorf("rank 1's failure %+v at %v", f, m.WallTime(f[0].Time))
	}
	if tr.Lost != 1 || tr.Counters["events"] != 7 || tr.Counters["ringbuf_full"] != 1 {
		t.Errorf("lost %d counters %v, want the sums", tr.Lost, tr.Counters)
	}
	if tr.End == nil || len(tr.End.Nodes) != 2 || !tr.End.Nodes[0].Complete || tr.End.Nodes[1].Events != 4 ||
		tr.End.Nodes[0].Lost != 1 || tr.End.Events != 8 || tr.Warning != "" {
		t.Errorf("end %+v, warning %q", tr.End, tr.Warning)
	}
	// Events in time order across the nodes.
	r, err := tracefile.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var last uint64
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type == tracefile.TypeEvent {
			if rec.Event.Time < last {
				t.Errorf("event at %d after one at %d", rec.Event.Time, last)
			}
			last = rec.Event.Time
		}
	}
}

// PIDs go to processes in the order they were seen in time, whatever the
// order of the traces on the command line: merged either way, each
// process has the same number.
func TestMergeOrder(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	numbers := func(ins ...string) map[uint32]rankOf {
		path, _ := mergeFiles(t, ins...)
		tr, err := replay.Read(path, replay.Options{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]rankOf{}
		for _, p := range tr.Ledger.Processes() {
			c := tr.First(p.PID)
			out[p.PID] = rankOf{c.Node, c.NodePID, c.Rank()}
		}
		return out
	}
	ab, ba := numbers(a, b), numbers(b, a)
	if !reflect.DeepEqual(ab, ba) || len(ab) != 4 {
		t.Errorf("merged a, b: %+v\nmerged b, a: %+v", ab, ba)
	}
}

// A trace cut short is merged up to its cut, and the merge says so; a
// merged trace merged again keeps its nodes, their processes' nodes and
// node PIDs.
func TestMergeTruncatedAndAgain(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	data, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "b-cut.trace")
	if err := os.WriteFile(cut, data[:len(data)-10], 0o600); err != nil {
		t.Fatal(err)
	}
	path, res := mergeFiles(t, a, cut)
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "node-b") || !strings.Contains(res.Warnings[0], "truncated") {
		t.Errorf("warnings %q, want node b's trace said truncated", res.Warnings)
	}
	tr, err := replay.Read(path, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if e := tr.End.Nodes[1]; e.Complete || !strings.Contains(e.Warning, "truncated") || e.Events != 4 {
		t.Errorf("node b's end %+v", e)
	}

	again, _ := mergeFiles(t, path)
	tr2, err := replay.Read(again, replay.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr2.Meta.Nodes) != 2 || tr2.Meta.Nodes[1].Offset != tr.Meta.Nodes[1].Offset || len(tr2.End.Nodes) != 2 {
		t.Errorf("merged again: nodes %+v, ends %+v", tr2.Meta.Nodes, tr2.End.Nodes)
	}
	if c := tr2.First(merge.FirstRenumbered); c.Node != "node-a" || c.NodePID != 100 {
		t.Errorf("merged again, pid %d is %+v", merge.FirstRenumbered, c)
	}
}

func TestMergeRefusesNonTrace(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "x.trace")
	if err := os.WriteFile(bad, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := tracetest.TwoNodes(t)
	if _, err := merge.Write(io.Discard, []merge.Input{{Path: a}, {Path: bad}}, "t"); err == nil || !strings.Contains(err.Error(), "not a cudatrace trace") {
		t.Errorf("err %v", err)
	}
	if _, err := merge.Write(io.Discard, nil, "t"); err == nil {
		t.Error("no input merged")
	}
	// A trace whose start the wall clock does not place.
	nowhere, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", StartBoot: 5})
	if _, err := merge.Write(io.Discard, []merge.Input{{Path: a}, {Path: nowhere}}, "t"); err == nil ||
		!strings.Contains(err.Error(), "no wall-clock start") {
		t.Errorf("err %v", err)
	}
}

// The same trace given twice is refused: merged, each of its processes
// would be two, and a job twice its ranks.
func TestMergeRefusesTwice(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	copyA := filepath.Join(t.TempDir(), "copy.trace")
	data, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(copyA, data, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, ins := range [][]merge.Input{{{Path: a}, {Path: b}, {Path: a}}, {{Path: a}, {Path: copyA}}} {
		if _, err := merge.Write(io.Discard, ins, "t"); err == nil || !strings.Contains(err.Error(), "are the same trace") {
			t.Errorf("merging %v: err %v, want the same trace refused", ins, err)
		}
	}
}

// A node's trace that stops before its meta (its recording killed at its
// start) is left out with a warning, the others merged, as a window that
// could not be fetched is.
func TestMergeLeavesOutHeaderOnly(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	data, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, n := range []int{0, 8, 64} {
		cut := filepath.Join(dir, fmt.Sprintf("b-%d.trace", n))
		if err := os.WriteFile(cut, data[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		path, res := mergeFiles(t, a, cut)
		if len(res.Nodes) != 1 || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], cut+" left out") {
			t.Errorf("%d bytes: nodes %d, warnings %q", n, len(res.Nodes), res.Warnings)
		}
		if _, err := replay.Read(path, replay.Options{}); err != nil {
			t.Errorf("%d bytes: the merged trace: %v", n, err)
		}
	}
}
