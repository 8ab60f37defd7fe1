package vmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/memviztest"
	"github.com/cudatrace/cudatrace/internal/testenv"
)

// TestAgentHistory: the agent's flight recorder. A job allocates 200000
// times, fails with out of memory and is SIGKILLed; its OOM black box, and
// /snapshot after its death, carry its last --history-events events as
// memory_viz trace entries, exactly as the stand-in's log has them, on
// each device.
func TestAgentHistory(t *testing.T) {
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	dumps := filepath.Join(dir, "oom")
	const keep = 1000
	ag := startAgent(t, ctx, "--dump-dir", dumps, "--history-events", strconv.Itoa(keep), "--ring-size", "64MiB")
	log := filepath.Join(dir, "job.log")
	j := startJob(t, ctx, log)
	j.do(t, "ok", "weights %d 1", 3<<20)
	j.do(t, "ok", "steps %d %d", 200000-1, 4096)
	j.do(t, "oom", "grow %d", 2*fakeMemLimit)
	fmt.Fprintln(j.in, "die 0")
	if err := j.cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("agentload after die: %v, want killed", err)
	}

	// The stand-in's truth: this job's last keep allocations, frees and
	// failed allocations, as memviz entries per device.
	calls, err := parseLogFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var mine []logCall
	for _, c := range calls {
		if c.PID == j.pid && classOf(c.API) != classOther {
			mine = append(mine, c)
		}
	}
	if len(mine) != 2*200000 {
		t.Fatalf("the log has %d allocations, frees and failures of pid %d, want %d", len(mine), j.pid, 2*200000)
	}
	want := map[int][]string{}
	for _, c := range mine[len(mine)-keep:] {
		add := func(actions ...string) {
			for _, a := range actions {
				want[c.Dev] = append(want[c.Dev], fmt.Sprintf("%s %#x %d", a, c.Ptr, c.Size))
			}
		}
		switch {
		case classOf(c.API) == classFree:
			add("free_requested", "free_completed", "segment_free")
		case c.Ret == 2:
			want[c.Dev] = append(want[c.Dev], fmt.Sprintf("oom 0x0 %d", c.Req))
		default:
			add("segment_alloc", "alloc")
		}
	}
	py := testenv.Python3(t, "pickle", "json")
	check := func(what, path string) {
		t.Helper()
		memviztest.Check(t, path, memviztest.Want{})
		out := testenv.RunPython(t, py, `import json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
print(json.dumps({str(dev): ["%s %#x %d" % (e["action"], e.get("addr", 0), e["size"]) for e in tr] for dev, tr in enumerate(d["device_traces"]) if tr}))`, path)
		var got map[string][]string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %v: %s", what, err, out)
		}
		if len(got) != len(want) {
			t.Errorf("%s: entries on %d devices, want %d", what, len(got), len(want))
		}
		for dev, w := range want {
			g := got[strconv.Itoa(dev)]
			if strings.Join(g, "\n") != strings.Join(w, "\n") {
				t.Errorf("%s: device %d: %d entries, want %d; first %q, want %q; last %q, want %q", what, dev,
					len(g), len(w), first(g), first(w), last(g), last(w))
			}
		}
	}

	var report string
	for deadline := time.Now().Add(30 * time.Second); report == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		files, _ := filepath.Glob(filepath.Join(dumps, fmt.Sprintf("oom-%d-*.json", j.pid)))
		if len(files) == 1 {
			report = files[0]
		}
	}
	if report == "" {
		t.Fatalf("no OOM dump of pid %d in %s", j.pid, dumps)
	}
	data, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		History struct {
			Events int    `json:"events"`
			Since  string `json:"since"`
		} `json:"history"`
		Files struct {
			Memviz string `json:"memviz"`
		} `json:"files"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.History.Events != keep || rep.History.Since == "" {
		t.Errorf("the dump's history: %+v, want %d events", rep.History, keep)
	}
	check("OOM dump", filepath.Join(dumps, rep.Files.Memviz))

	// After the SIGKILL the agent still has it (--retention).
	snap := filepath.Join(dir, "snapshot.pickle")
	if err := os.WriteFile(snap, get(t, ctx, fmt.Sprintf("%s/snapshot?pid=%d", ag.url, j.pid), http.StatusOK), 0o600); err != nil {
		t.Fatal(err)
	}
	check("/snapshot after the SIGKILL", snap)

	// (Losses are not checked: the agent traces every process on the
	// machine, other tests' too; a loss of this job's would show above.)
	m := parseMetrics(t, get(t, ctx, ag.url+"/metrics", http.StatusOK))
	if n, _ := metric(t, m, "cudatrace_history_events"); n < keep {
		t.Errorf("cudatrace_history_events %v, want at least the job's %d", n, keep)
	}
	ag.stop(t)
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}
