package agent

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/testenv"
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

// TestWriteFile0600: a dump file appears whole under its name, 0600
// whatever the umask, with no temporary left beside it; an existing file
// (or a symlink planted at the name) is neither replaced nor followed.
func TestWriteFile0600(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "oom-1.json")
	data := bytes.Repeat([]byte("x"), 1<<20)
	// Whole under its name: no write is ever made to it by that name
	// (inotify names the file each IN_MODIFY was made through).
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, dir, unix.IN_MODIFY); err != nil {
		t.Fatal(err)
	}
	if err := writeFile0600(path, data); err != nil {
		t.Fatal(err)
	}
	for _, ev := range testenv.ReadInotify(in) {
		if ev.Name == filepath.Base(path) {
			t.Fatalf("%s was written to under its own name: a reader could see it cut short", path)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v (%v), want 0600", fi.Mode().Perm(), err)
	}
	if err := writeFile0600(path, []byte("other")); err == nil {
		t.Errorf("a second write of %s succeeded, want refused", path)
	}
	if got, _ := os.ReadFile(path); !bytes.Equal(got, data) {
		t.Errorf("the first dump was replaced by the second write")
	}
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "oom-2.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := writeFile0600(link, data); err == nil {
		t.Errorf("a write through the symlink %s succeeded, want refused", link)
	}
	if got, _ := os.ReadFile(target); string(got) != "keep" {
		t.Errorf("the symlink's target now holds %d bytes, want it untouched", len(got))
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"oom-1.json", "oom-2.json", "target"}; !slices.Equal(names, want) {
		t.Errorf("directory holds %v, want %v (no temporary left)", names, want)
	}
}
