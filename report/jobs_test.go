package report

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
)

// A merged trace's job: every rank with its node, its peak and end
// figures as each rank's own, how unevenly they peaked, and the rank that
// ran out first with what every rank held then.
func TestJobReport(t *testing.T) {
	rep, err := Load(tracetest.TwoNodesMerged(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 {
		t.Fatalf("jobs %+v", rep.Jobs)
	}
	j := rep.Jobs[0]
	if j.ID != "slurm:42.0" || j.Name != "train" || j.WorldSize != 4 || !reflect.DeepEqual(j.Nodes, []string{"node-a", "node-b"}) ||
		j.Missing != 0 || len(j.Ranks) != 4 {
		t.Errorf("job %+v", j)
	}
	nodes := []string{"node-a", "node-a", "node-b", "node-b"}
	for i, r := range j.Ranks {
		if r.Rank != i || r.Node != nodes[i] || r.PeakBytes != tracetest.RankPeak[i] || r.LiveBytes != tracetest.RankLive[i] {
			t.Errorf("rank %d: %+v, want on %s, peak %d, live %d", i, r, nodes[i], tracetest.RankPeak[i], tracetest.RankLive[i])
		}
	}
	if r := j.Ranks[0]; r.NodePID != 100 || r.PID != merge.FirstRenumbered {
		t.Errorf("rank 0: pid %d node pid %d, want %d (100 on node-a)", r.PID, r.NodePID, merge.FirstRenumbered)
	}
	mean := (1 + 10 + 3 + 4) << 20 / 4
	if p := j.Peak; p.MinBytes != 1<<20 || p.MinRank != 0 || p.MaxBytes != 10<<20 || p.MaxRank != 1 ||
		p.MeanBytes != uint64(mean) || p.Imbalance != float64(10<<20)/float64(mean) {
		t.Errorf("peak spread %+v", p)
	}
	f := j.FirstFailure
	if f == nil || f.Rank == nil || *f.Rank != 2 || f.Node != "node-b" || f.PID != 100 || f.NodePID != 0 ||
		time.Duration(f.AfterNS) != tracetest.FirstOOMAfter+10 || f.Error != "cudaErrorMemoryAllocation" || f.Size != 64<<30 {
		t.Fatalf("first failure %+v", f)
	}
	if len(f.Frames) == 0 || f.Frames[0].Address != "0x1234" {
		t.Errorf("its stack %+v, want 0x1234 innermost", f.Frames)
	}
	if at, _ := time.Parse(time.RFC3339Nano, f.Time); !at.Equal(tracetest.Wall.Add(2*time.Second + 10)) {
		t.Errorf("its time %s, want %v", f.Time, tracetest.Wall.Add(2*time.Second+10))
	}
	if len(f.Held) != 4 {
		t.Fatalf("held %+v", f.Held)
	}
	for i, h := range f.Held {
		if h.Rank == nil || *h.Rank != i || h.LiveBytes != tracetest.RankHeldAtFirstOOM[i] || h.Node != nodes[i] {
			t.Errorf("held by rank %d: %+v, want %d", i, h, tracetest.RankHeldAtFirstOOM[i])
		}
	}
	if f.LiveBytes != 3<<20 {
		t.Errorf("the failing rank held %d", f.LiveBytes)
	}
	// The nodes and how they aligned: both synchronized, 1 ms estimated
	// error each, pairs of 2 and 4 µs.
	if len(rep.Nodes) != 2 || !rep.Nodes[1].Complete || rep.Nodes[0].Events != 4 {
		t.Errorf("nodes %+v", rep.Nodes)
	}
	if bound, ok := Alignment(rep.Nodes); !ok || bound != 2*time.Millisecond+3*time.Microsecond {
		t.Errorf("alignment %s %v, want 2.003ms", bound, ok)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"on 2 nodes (node-a, node-b)",
		"they align to within 2.003ms",
		"Job slurm:42.0 (train): 4 ranks of 4 on 2 nodes (node-a, node-b)",
		"Peak per rank: 1.0 MiB (rank 0) to 10.0 MiB (rank 1), mean 4.5 MiB: the highest is 2.22× the mean",
		"First failure in the job: rank 2 (pid 100) on node-b, 3s into the trace at 12:00:02.000000 UTC: cudaMalloc of 64.0 GiB on gpu 0 failed: cudaErrorMemoryAllocation (2)",
		"   0  node-a  node-a:100   1.0 MiB   1.0 MiB       0",
		"   1  node-a         101  10.0 MiB  10.0 MiB       1",
		"   2  node-b         100   3.0 MiB  failed",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
	// The process table: NODE, JOB and RANK columns, the job's ranks in
	// order; node a's renumbered pid shows its own.
	if !strings.Contains(text.String(), "4194305  python3  node-a:100  slurm:42.0     0") {
		t.Errorf("process table:\n%s", text.String())
	}
}

// The JSON names every process by job and rank, rank 0 included.
func TestJobReportJSON(t *testing.T) {
	rep, err := Load(tracetest.TwoNodesMerged(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Processes []struct {
			PID     uint32 `json:"pid"`
			Node    string `json:"node"`
			NodePID uint32 `json:"node_pid"`
			Job     struct {
				ID   string `json:"id"`
				Rank *int   `json:"rank"`
			} `json:"job"`
		} `json:"processes"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	ranks := map[int]string{}
	for _, p := range doc.Processes {
		if p.Job.ID != "slurm:42.0" || p.Job.Rank == nil {
			t.Errorf("process %+v", p)
			continue
		}
		ranks[*p.Job.Rank] = p.Node
	}
	if !reflect.DeepEqual(ranks, map[int]string{0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}) {
		t.Errorf("ranks %v", ranks)
	}
}

// One node's trace alone: its ranks on its host, its own first failure.
func TestJobReportOneNode(t *testing.T) {
	a, _ := tracetest.TwoNodes(t)
	rep, err := Load(a, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Jobs) != 1 || len(rep.Nodes) != 0 {
		t.Fatalf("jobs %+v nodes %+v", rep.Jobs, rep.Nodes)
	}
	j := rep.Jobs[0]
	if len(j.Ranks) != 2 || j.Missing != 2 || !reflect.DeepEqual(j.MissingRanks, []int{2, 3}) || j.Ranks[1].Node != "node-a" {
		t.Errorf("job %+v", j)
	}
	if f := j.FirstFailure; f == nil || *f.Rank != 1 || len(f.Held) != 2 || f.Held[1].LiveBytes != 10<<20 {
		t.Errorf("first failure %+v", f)
	}
}

// Two runs of the job side by side, rank by rank.
func TestDiffRanks(t *testing.T) {
	a, _ := tracetest.TwoNodes(t)
	d, err := LoadDiff(a, tracetest.TwoNodesMerged(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []RankDelta{
		{Rank: 0, Peak: delta(1<<20, 1<<20), Live: delta(1<<20, 1<<20)},
		{Rank: 1, Peak: delta(10<<20, 10<<20), Live: delta(10<<20, 10<<20)},
		{Rank: 2, Peak: delta(0, 3<<20), Live: delta(0, 3<<20), OnlyIn: "b"},
		{Rank: 3, Peak: delta(0, 4<<20), Live: delta(0, 0), OnlyIn: "b"},
	}
	if !reflect.DeepEqual(d.Ranks, want) {
		t.Errorf("ranks\n got %+v\nwant %+v", d.Ranks, want)
	}
	var text bytes.Buffer
	if err := d.WriteText(&text, 5); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "   2       0 B   3.0 MiB  +3.0 MiB       0 B   3.0 MiB  +3.0 MiB  only in b") {
		t.Errorf("diff text:\n%s", text.String())
	}
}
