package export

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
)

func mergedJob(t *testing.T) string {
	t.Helper()
	a, b := tracetest.TwoNodes(t)
	var buf bytes.Buffer
	if _, err := merge.Write(&buf, []merge.Input{{Path: a}, {Path: b}}, "t"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "job.trace")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkTraceEvents checks a Chrome trace-event document as a viewer reads
// it: every event of a known phase, each process named once, each counter
// track's times rising. It returns the process names by PID, the sort
// indexes, and each counter track's last value ("pid/name").
func checkTraceEvents(t *testing.T, data []byte) (names map[uint32]string, sort map[uint32]int, last map[string]float64) {
	t.Helper()
	var doc struct {
		TraceEvents []traceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%v:\n%s", err, data)
	}
	names, sort, last = map[uint32]string{}, map[uint32]int{}, map[string]float64{}
	ts := map[string]float64{}
	used := map[uint32]bool{}
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "M":
			switch e.Name {
			case "process_name":
				if _, dup := names[e.PID]; dup {
					t.Errorf("pid %d named twice", e.PID)
				}
				names[e.PID] = e.Args["name"].(string)
			case "process_sort_index":
				sort[e.PID] = int(e.Args["sort_index"].(float64))
			case "thread_name":
			default:
				t.Errorf("metadata %q", e.Name)
			}
		case "C":
			k := itoa(e.PID) + "/" + e.Name
			if e.TS < ts[k] {
				t.Errorf("%s: a value at %v after one at %v", k, e.TS, ts[k])
			}
			ts[k] = e.TS
			last[k] = e.Args["live_bytes"].(float64)
			used[e.PID] = true
		case "i":
			used[e.PID] = true
		default:
			t.Errorf("event of phase %q", e.Ph)
		}
	}
	for pid := range used {
		if names[pid] == "" {
			t.Errorf("pid %d has events and no name", pid)
		}
	}
	return names, sort, last
}

func itoa(pid uint32) string { return strconv.FormatUint(uint64(pid), 10) }

// A merged job's timeline: one process per rank, titled by rank, node and
// the PID it had there, ordered by rank, each ending at its rank's live
// bytes.
func TestPerfettoJob(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, mergedJob(t), Options{}); err != nil {
		t.Fatal(err)
	}
	names, sort, last := checkTraceEvents(t, buf.Bytes())
	wantNames := map[uint32]string{merge.FirstRenumbered: "rank 0 · node-a · pid 100", 101: "rank 1 · node-a · pid 101",
		100: "rank 2 · node-b · pid 100", 102: "rank 3 · node-b · pid 102"}
	if !reflect.DeepEqual(names, wantNames) {
		t.Errorf("names %v, want %v", names, wantNames)
	}
	if !reflect.DeepEqual(sort, map[uint32]int{merge.FirstRenumbered: 0, 101: 1, 100: 2, 102: 3}) {
		t.Errorf("sort indexes %v", sort)
	}
	for pid, rank := range map[uint32]int{merge.FirstRenumbered: 0, 101: 1, 100: 2, 102: 3} {
		if got := last[itoa(pid)+"/GPU 0 memory"]; uint64(got) != tracetest.RankLive[rank] {
			t.Errorf("rank %d's track ends at %v, want %d", rank, got, tracetest.RankLive[rank])
		}
	}
}

// The profile labels each sample with its process's job, rank and node.
func TestPprofJobLabels(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePprof(&buf, mergedJob(t), Options{}); err != nil {
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
	err := WriteMemvizTrace(&bytes.Buffer{}, mergedJob(t), Options{})
	if err == nil || !strings.Contains(err.Error(), "choose one with --pid or --rank (100 (rank 2 · node-b · pid 100), 101 (rank 1 · node-a · pid 101)") {
		t.Errorf("err %v", err)
	}
	if err := WriteMemvizTrace(&bytes.Buffer{}, mergedJob(t), Options{PIDs: []uint32{merge.FirstRenumbered}}); err != nil {
		t.Errorf("rank 0's snapshot: %v", err)
	}
}
