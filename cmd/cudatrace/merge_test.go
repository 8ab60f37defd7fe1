package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/merge"
)

// merge, then report one rank of the merged trace, by --rank and by the
// merged trace's own number of a PID two nodes had.
func TestMergeCLI(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	out := filepath.Join(t.TempDir(), "job.trace")
	code, _, stderr := runCLI("merge", a, b, "-o", out)
	if code != 0 || !strings.Contains(stderr, "cudatrace: merged 2 traces (node-a, node-b), 8 events, into "+out+"; 1 process numbered anew") ||
		!strings.Contains(stderr, "clocks: node-a synchronized (estimated error 1ms); node-b synchronized (estimated error 1ms)") {
		t.Fatalf("merge: exit %d\n%s", code, stderr)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, mode %v", out, err, fi.Mode())
	}
	ranks := func(args ...string) map[int]string {
		code, stdout, stderr := runCLI(append([]string{"report", out, "--json"}, args...)...)
		if code != 0 {
			t.Fatalf("report %q: exit %d\n%s", args, code, stderr)
		}
		var doc struct {
			Processes []struct {
				Node string `json:"node"`
				Job  struct {
					Rank int `json:"rank"`
				} `json:"job"`
			} `json:"processes"`
		}
		if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
			t.Fatal(err)
		}
		got := map[int]string{}
		for _, p := range doc.Processes {
			got[p.Job.Rank] = p.Node
		}
		return got
	}
	if got := ranks("--rank", "2,3"); !reflect.DeepEqual(got, map[int]string{2: "node-b", 3: "node-b"}) {
		t.Errorf("--rank 2,3: %v", got)
	}
	if got := ranks("--pid", "4194305"); !reflect.DeepEqual(got, map[int]string{0: "node-a"}) {
		t.Errorf("--pid %d: %v", merge.FirstRenumbered, got)
	}
	// A renumbered process as report shows it, NODE:PID; and one that kept
	// its PID, by its node.
	if got := ranks("--pid", "node-a:100"); !reflect.DeepEqual(got, map[int]string{0: "node-a"}) {
		t.Errorf("--pid node-a:100: %v", got)
	}
	if got := ranks("--pid", "node-b:100"); !reflect.DeepEqual(got, map[int]string{2: "node-b"}) {
		t.Errorf("--pid node-b:100: %v", got)
	}
	// A job the trace lacks is said to be lacking, not a rank.
	code, _, stderr = runCLI("report", out, "--rank", "1", "--job", "nope")
	if code != 1 || !strings.Contains(stderr, "cudatrace: --job nope: no such job in the trace") || strings.Contains(stderr, "rank 1 is not") {
		t.Errorf("--job nope: exit %d\n%s", code, stderr)
	}
	code, _, stderr = runCLI("report", out, "--rank", "7")
	if code != 1 || !strings.Contains(stderr, "cudatrace: rank 7 is not in the trace") ||
		!strings.Contains(stderr, "hint: the trace has ranks 0-3 of slurm:42.0") {
		t.Errorf("--rank 7: exit %d\n%s", code, stderr)
	}
	// One rank's memory snapshot.
	snap := filepath.Join(t.TempDir(), "rank1.pickle")
	if code, _, stderr := runCLI("export", out, "-f", "memviz", "--rank", "1", "-o", snap); code != 0 {
		t.Errorf("export --rank 1: exit %d\n%s", code, stderr)
	}
}

// The agents' windows are fetched with their token, and one that cannot
// be is left out with a warning, the others merged.
func TestMergeFetches(t *testing.T) {
	a, b := tracetest.TwoNodes(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "cudatrace agent: a bearer token is required", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/a/trace":
			http.ServeFile(w, r, a)
		case "/b/trace":
			http.ServeFile(w, r, b)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "job.trace")
	code, _, stderr := runCLI("merge", "--token-file", token, "-o", out,
		srv.URL+"/a/trace?seconds=1", srv.URL+"/b/trace?seconds=1", srv.URL+"/c/trace?seconds=1")
	if code != 0 || !strings.Contains(stderr, "cudatrace: warning: "+srv.URL+"/c/trace?seconds=1: 404 Not Found: 404 page not found; left out of the merge") ||
		!strings.Contains(stderr, "merged 2 traces (node-a, node-b)") {
		t.Fatalf("merge: exit %d\n%s", code, stderr)
	}
	code, stdout, _ := runCLI("report", out, "--json")
	var doc struct {
		Nodes []struct {
			Trace string `json:"trace"`
		} `json:"nodes"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &doc) != nil || len(doc.Nodes) != 2 || doc.Nodes[1].Trace != srv.URL+"/b/trace?seconds=1" {
		t.Errorf("report: exit %d, nodes %+v", code, doc.Nodes)
	}
	// The fetched windows are not left behind.
	if left, _ := filepath.Glob(filepath.Join(dir, ".cudatrace-merge-*")); len(left) != 0 {
		t.Errorf("left %v", left)
	}
	// Without the token nothing can be fetched.
	code, _, stderr = runCLI("merge", "-o", out, srv.URL+"/a/trace")
	if code != 1 || !strings.Contains(stderr, "401 Unauthorized: cudatrace agent: a bearer token is required") ||
		!strings.Contains(stderr, "cudatrace: no trace could be fetched") {
		t.Errorf("merge without the token: exit %d\n%s", code, stderr)
	}
}

func TestSpans(t *testing.T) {
	for _, c := range []struct {
		in   []int
		want string
	}{{[]int{3, 0, 1, 2}, "0-3"}, {[]int{7, 5, 9, 8, 0, 0}, "0, 5, 7-9"}, {[]int{4}, "4"}} {
		if got := spans(c.in); got != c.want {
			t.Errorf("spans(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}
