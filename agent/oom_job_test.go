package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/procmodel"
)

// The OOM black box of a rank is named by its job and rank, its report
// and profile say them, and the agent's stats carry them.
func TestOOMDumpOfRank(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "oom")
	s := newSession(t, Options{DumpDir: dir, DumpEvery: time.Hour})
	pid := uint32(os.Getpid())
	id := &jobid.Identity{Job: "slurm:42.0", Name: "train", Launcher: "slurm", Rank: 3, LocalRank: 1, WorldSize: 8, NodeRank: 1}
	s.run(func() { s.a.Process(&procmodel.Capture{PID: pid, Comm: "python3", Job: id}) })
	s.event(events.Event{PID: pid, Comm: "python3", API: events.CudaMalloc, Addr: 0x10000, Size: 4096, Stack: []uint64{1}})
	s.event(events.Event{PID: pid, TID: 9, Comm: "python3", API: events.CudaMalloc, Size: 1 << 40, Result: 2, Stack: []uint64{3}})

	var files []string
	for deadline := time.Now().Add(5 * time.Second); len(files) < 3 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		files, _ = filepath.Glob(filepath.Join(dir, "oom-*"))
	}
	if len(files) != 3 {
		t.Fatalf("dump files %v, want 3", files)
	}
	prefix := filepath.Join(dir, "oom-slurm_42.0-rank3-"+strconv.FormatUint(uint64(pid), 10)+"-")
	for _, f := range files {
		if !strings.HasPrefix(f, prefix) {
			t.Errorf("%s: want it named %s…", f, prefix)
		}
		switch filepath.Ext(f) {
		case ".json":
			data, _ := os.ReadFile(f)
			var rep OOMReport
			if err := json.Unmarshal(data, &rep); err != nil {
				t.Fatal(err)
			}
			if j := rep.Process.Job; j == nil || j.ID != "slurm:42.0" || j.Rank == nil || *j.Rank != 3 || j.WorldSize != 8 {
				t.Errorf("report's job %+v", rep.Process.Job)
			}
		case ".gz":
			fh, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			p, err := profile.Parse(fh)
			fh.Close()
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Sample) == 0 || p.Sample[0].Label["job_id"][0] != "slurm:42.0" || p.Sample[0].Label["rank"][0] != "3" {
				t.Errorf("profile samples %v", p.Sample)
			}
		}
	}
	st, err := s.a.Stats(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 1 || st.Processes[0].Job != "slurm:42.0" || st.Processes[0].Rank != 3 {
		t.Errorf("stats %+v", st.Processes)
	}
}

func TestFileSafe(t *testing.T) {
	for in, want := range map[string]string{"slurm:42.0": "slurm_42.0", "torch:10.0.0.1:29500": "torch_10.0.0.1_29500",
		"../x/y": "_x_y", strings.Repeat("a", 100): strings.Repeat("a", 64)} {
		if got := fileSafe(in); got != want {
			t.Errorf("fileSafe(%q) = %q, want %q", in, got, want)
		}
	}
}
