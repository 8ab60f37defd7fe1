package vmtest

// The HTML page (export --format html, the agent's /ui) of real
// recordings in headless Chromium: make demo's workload, an attach
// (record --pid) to a process that holds memory made before, and the
// agent's live page refreshing as a job allocates. What the page shows is
// read from its tables and flame graph, against report and the trace's
// own events. Privileged.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/browsertest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	ctreport "github.com/cudatrace/cudatrace/report"
)

// exportHTML writes trace's page with the cudatrace binary and opens it,
// failing t on a JavaScript error or any request but the page's own.
func exportHTML(t *testing.T, ctx context.Context, b *browsertest.Browser, trace string) {
	t.Helper()
	page := strings.TrimSuffix(trace, ".trace") + ".html"
	if out, err := exec.CommandContext(ctx, tracerBin, "export", trace, "--format", "html", "-o", page).CombinedOutput(); err != nil {
		t.Fatalf("export html: %v\n%s", err, out)
	}
	b.Open(t, "file://"+page, time.Minute)
	t.Cleanup(func() { b.CheckClean(t, "file://"+page) })
}

// nativeLine is a native frame's line as FrameText writes it: "(file:N)".
var nativeLine = regexp.MustCompile(`:[0-9]+\)$`)

// pathOf is a stack's frames as one call path (report.PathKey): report,
// and the page after it, take a native function's calls from two lines as
// one path, shown with one of their lines; the lines of native frames
// are left out here, every function, file and module kept. (These tests'
// programs have no Python frames, whose lines a path does keep.)
func pathOf(frames []string) string {
	out := make([]string, len(frames))
	for i, f := range frames {
		out[i] = nativeLine.ReplaceAllString(f, ")")
	}
	return fmt.Sprint(out)
}

// checkPeaks compares the page's call paths at each process's peak with
// report's: every path and byte.
func checkPeaks(t *testing.T, b *browsertest.Browser, rep *ctreport.Report) {
	t.Helper()
	for _, p := range rep.Processes {
		b.Select(t, "#pid", strconv.Itoa(int(p.PID)))
		var got, want []string
		for _, r := range b.PathRows(t, "#paths") {
			got = append(got, fmt.Sprint(r.Bytes, pathOf(r.Frames)))
		}
		var peak uint64
		for _, ps := range rep.PeakStacks {
			if ps.PID != p.PID {
				continue
			}
			var fs []string
			for _, f := range ps.Frames {
				fs = append(fs, browsertest.FrameText(f.Function, f.File, f.Line, f.Module, f.Address))
			}
			want = append(want, fmt.Sprint(ps.LiveBytes, pathOf(fs)))
			peak += ps.LiveBytes
		}
		slices.Sort(got)
		slices.Sort(want)
		if len(want) == 0 || !slices.Equal(got, want) || peak != p.PeakBytes {
			t.Errorf("pid %d at its peak (%d bytes, report's stacks %d):\n page   %q\n report %q", p.PID, p.PeakBytes, peak, got, want)
		}
		if total := b.DataBytes(t, "#moment-title"); total != p.PeakBytes {
			t.Errorf("pid %d: the page says %d bytes at the peak, report %d", p.PID, total, p.PeakBytes)
		}
	}
}

// leftLive is, by call path (each frame as the page writes it), the GPU
// memory (segments) pid allocated in [t0, t1) (boot ns) and had not freed
// by t1: what the page's range view must show.
func leftLive(t *testing.T, trace string, pid uint32, t0, t1 uint64) (map[string]uint64, map[string]int) {
	t.Helper()
	made := map[*ledger.Allocation]bool{}
	tr, err := replay.Read(trace, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		if ch.Process == nil || ch.Process.PID != pid || ev.End() >= t1 {
			return nil
		}
		for a := range ch.AllFreed() {
			if !ch.Exit {
				delete(made, a)
			}
		}
		if a := ch.Alloc; a != nil && a.API.Segment() && ev.End() >= t0 {
			made[a] = true
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	syms := tr.Symbols(true)
	defer syms.Close()
	bytes, count := map[string]uint64{}, map[string]int{}
	for a := range made {
		var fs []string
		for _, f := range ctreport.Frames(syms.Frames(a.Stack)) {
			fs = append(fs, browsertest.FrameText(f.Function, f.File, f.Line, f.Module, f.Address))
		}
		k := pathOf(fs)
		bytes[k] += a.Size
		count[k]++
	}
	return bytes, count
}

// TestHTMLDemo: make demo's workload, recorded: its page loads with no
// error, its peak is report's, and a range of its training steps shows
// exactly what they left live: record_metrics' 4 MiB a step, the leak.
func TestHTMLDemo(t *testing.T) {
	ctx, dir := traceSetup(t)
	trace := filepath.Join(dir, "demo.trace")
	rec := startRecord(t, ctx, recordOpts{Env: fakeEnv("")}, "--lib", fakeLib, "-q", "-o", trace, "--", workload("train"))
	rec.finish(t, 45*time.Second)
	rep, err := ctreport.Load(trace, ctreport.Options{Top: 100})
	if err != nil {
		t.Fatal(err)
	}
	b := browsertest.Start(t)
	exportHTML(t, ctx, b, trace)
	checkPeaks(t, b, rep)

	// The steps: from the 5th record_metrics call to the 20th.
	pid := rep.Processes[0].PID
	var metrics []uint64
	tr, err := replay.Read(trace, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		if a := ch.Alloc; a != nil && a.Size == 4<<20 {
			metrics = append(metrics, ev.End())
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(metrics) != 25 {
		t.Fatalf("%d allocations of 4 MiB (record_metrics), want 25", len(metrics))
	}
	start := tr.Meta.StartBoot
	from, to := b.DragTime(t, metrics[4]-start, metrics[19]-start)
	want, wantCount := leftLive(t, trace, pid, start+from, start+to)
	got := map[string]uint64{}
	var metricsRow *browsertest.PathRow
	rows := b.PathRows(t, "#leaks")
	for i, r := range rows {
		got[pathOf(r.Frames)] += r.Bytes
		if len(r.Frames) > 1 && strings.HasPrefix(r.Frames[1], "record_metrics ") {
			metricsRow = &rows[i]
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("left live by the range %d-%d ns:\n page   %v\n events %v", from, to, got, want)
	}
	// The leak's line is the user's (record_metrics' call), not the
	// allocation helper all the paths share (cuda_alloc's, line 27).
	if metricsRow == nil || metricsRow.Bytes < 10*4<<20 || metricsRow.Count != strconv.Itoa(wantCount[pathOf(metricsRow.Frames)]) ||
		metricsRow.Bytes != uint64(wantCount[pathOf(metricsRow.Frames)])*4<<20 || !strings.HasSuffix(metricsRow.Line, "demo/workload.c:47") {
		t.Errorf("record_metrics' leak in the range: %+v", metricsRow)
	}
}

// TestHTMLAttach: record --pid of a process holding memory made before the
// attach (attach_later): its page loads with no error, its peak is
// report's, and its processes table says how many frees were of memory it
// never saw made.
func TestHTMLAttach(t *testing.T) {
	ctx, dir := traceSetup(t)
	log, trace := filepath.Join(dir, "fake.log"), filepath.Join(dir, "attach.trace")
	p := startAttachLater(t, log)
	rec := startRecord(t, ctx, recordOpts{}, "--lib", fakeLib, "--pid", strconv.Itoa(p.cmd.Process.Pid), "-o", trace)
	rec.waitAttached(t, 30*time.Second)
	p.proceed(t)
	if err := p.wait(t); err != nil {
		t.Fatalf("attach_later: %v\n%s", err, p.stderr.String())
	}
	rec.finish(t, 20*time.Second)
	rep, err := ctreport.Load(trace, ctreport.Options{Top: 100})
	if err != nil {
		t.Fatal(err)
	}
	b := browsertest.Start(t)
	exportHTML(t, ctx, b, trace)
	checkPeaks(t, b, rep)
	b.Tab(t, "processes")
	if notes := b.Text(t, "#procs tr:nth-child(2) td:last-child"); !strings.Contains(notes, fmt.Sprintf("%d frees of memory not seen allocated", rep.Processes[0].UnknownFrees)) {
		t.Errorf("the processes table's notes say %q; report: %d unknown frees", notes, rep.Processes[0].UnknownFrees)
	}
}

// TestHTMLAgentUI: the agent's /ui in a browser shows a job's memory and,
// as the job allocates more, refreshes to show it; /ui?pid= is the job's
// alone; with a token, /ui answers no one without it.
func TestHTMLAgentUI(t *testing.T) {
	requirePrivileged(t)
	needStandIns(t)
	needTracer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ag := startAgent(t, ctx)
	j := startJob(t, ctx, "")
	j.do(t, "ok", "weights %d 0", 3<<20)
	b := browsertest.Start(t)
	url := fmt.Sprintf("%s/ui?pid=%d", ag.url, j.pid)
	// The agent has the job's records within a tick or two.
	var summary string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		b.Open(t, url, 30*time.Second)
		if summary = b.Text(t, "#summary"); strings.Contains(summary, "peak 3.0 MiB") {
			break
		}
	}
	if !strings.Contains(summary, "peak 3.0 MiB") {
		t.Fatalf("/ui says %q, want the job's 3.0 MiB", summary)
	}
	j.do(t, "ok", "weights %d 0", 5<<20)
	b.Wait(t, `cudatrace.refreshes >= 1 && document.getElementById('summary').textContent.includes('peak 8.0 MiB')`, 30*time.Second)
	b.CheckClean(t, url, fmt.Sprintf("%s/ui/data?pid=%d", ag.url, j.pid))
	if rows := b.PathRows(t, "#paths"); len(rows) != 1 || rows[0].Bytes != 8<<20 || rows[0].Count != "2" || !strings.HasPrefix(rows[0].Frames[0], "load_weights ") {
		t.Errorf("the live set's call paths: %+v, want load_weights'", rows)
	}
	// The docs' screenshot of the live page (CUDATRACE_SCREENSHOTS=DIR).
	if dir := os.Getenv("CUDATRACE_SCREENSHOTS"); dir != "" {
		j.do(t, "ok", "steps %d %d", 50, 1<<20)
		b.Wait(t, `cudatrace.refreshes >= 2`, 30*time.Second)
		b.Screenshot(t, "", filepath.Join(dir, "html-agent.png"))
	}
	ag.stop(t)

	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ag = startAgent(t, ctx, "--token-file", tokenFile)
	get(t, ctx, ag.url+"/ui", 401)
	get(t, ctx, ag.url+"/ui/data", 401)
	if body := get(t, ctx, ag.url+"/ui", 200, "Authorization", "Bearer s3cret"); !strings.Contains(string(body), `<script id="data"`) {
		t.Errorf("/ui with the token: no page")
	}
	ag.stop(t)
}
