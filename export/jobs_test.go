package export

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/internal/perfettotest"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
)

// A merged job's timeline: one process per rank, titled by rank, node and
// the PID it had there, ordered by rank, each ending at its rank's live
// bytes.
func TestPerfettoJob(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, tracetest.TwoNodesMerged(t), Options{}); err != nil {
		t.Fatal(err)
	}
	tl := perfettotest.Check(t, buf.Bytes())
	names, sort, last := tl.Names, tl.Sort, tl.Last
	wantNames := map[uint32]string{merge.FirstRenumbered: "rank 0 · node-a · pid 100", 101: "rank 1 · node-a · pid 101",
		100: "rank 2 · node-b · pid 100", 102: "rank 3 · node-b · pid 102"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("names %v, want %v", names, wantNames)
	}
	if !reflect.DeepEqual(sort, map[uint32]int{merge.FirstRenumbered: 0, 101: 1, 100: 2, 102: 3}) {
		t.Errorf("sort indexes %v", sort)
	}
	for pid, rank := range map[uint32]int{merge.FirstRenumbered: 0, 101: 1, 100: 2, 102: 3} {
		if got := last[strconv.FormatUint(uint64(pid), 10)+"/GPU 0 memory"]; uint64(got) != tracetest.RankLive[rank] {
			t.Errorf("rank %d's track ends at %v, want %d", rank, got, tracetest.RankLive[rank])
		}
	}
}

// The profile labels each sample with its process's job, rank and node.
func TestPprofJobLabels(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePprof(&buf, tracetest.TwoNodesMerged(t), Options{}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{} // rank/node -> inuse_space
	for _, s := range p.Sample {
		if s.Label["job_id"][0] != "slurm:42.0" {
			t.Errorf("sample labels %v", s.Label)
		}
		got[s.Label["rank"][0]+"/"+s.Label["node"][0]] += s.Value[3]
	}
	want := map[string]int64{"0/node-a": 1 << 20, "1/node-a": 10 << 20, "2/node-b": 3 << 20, "3/node-b": 0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("inuse_space by rank %v, want %v", got, want)
	}
}

// A memory snapshot is one process's: the error says how to pick one,
// by PID or rank.
func TestMemvizPicksRank(t *testing.T) {
	err := WriteMemvizTrace(&bytes.Buffer{}, tracetest.TwoNodesMerged(t), Options{})
	if err == nil || !strings.Contains(err.Error(), "choose one with --pid or --rank (100 (rank 2 · node-b · pid 100), 101 (rank 1 · node-a · pid 101)") {
		t.Errorf("err %v", err)
	}
	if err := WriteMemvizTrace(&bytes.Buffer{}, tracetest.TwoNodesMerged(t), Options{PIDs: []uint32{merge.FirstRenumbered}}); err != nil {
		t.Errorf("rank 0's snapshot: %v", err)
	}
}

// The documented filter, go tool pprof -tagfocus rank=3, selects rank 3's
// samples and no other's; rank 0 is a rank like any other.
func TestPprofTagfocusRank(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to run go tool pprof")
	}
	file := filepath.Join(t.TempDir(), "job.pb.gz")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := WritePprof(f, tracetest.TwoNodesMerged(t), Options{}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, rank := range []string{"3", "0"} {
		out, err := exec.Command(gobin, "tool", "pprof", "-tagfocus", "rank="+rank, "-sample_index=alloc_space", "-traces", file).CombinedOutput()
		if err != nil {
			t.Fatalf("go tool pprof: %v\n%s", err, out)
		}
		n := 0
		for _, tr := range strings.Split(string(out), "-----------+-------------------------------------------------------")[1:] {
			if !strings.Contains(tr, "job_id:") {
				continue
			}
			n++
			for _, l := range strings.Split(tr, "\n") {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "rank:" && f[1] != rank {
					t.Errorf("-tagfocus rank=%s kept a sample of rank %s:\n%s", rank, f[1], tr)
				}
			}
		}
		if n == 0 {
			t.Errorf("-tagfocus rank=%s kept no sample:\n%s", rank, out)
		}
	}
}
