package export

// The page in a real browser: headless Chromium (internal/browsertest)
// opens pages written by WriteHTML, and the tests read what the page
// shows (its tables, its flame graph's rectangles) against the report and
// against the trace's own events.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/browsertest"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/tracefile"
)

// openHTML writes the page of the trace at path and opens it; the test
// fails on any JavaScript error, or on any request but the page's own.
func openHTML(t *testing.T, b *browsertest.Browser, path string, opts Options) string {
	t.Helper()
	page := filepath.Join(t.TempDir(), "page.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(f, path, opts); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	took := b.Open(t, "file://"+page, time.Minute)
	st, _ := os.Stat(page)
	t.Logf("%s: %d bytes, ready in %v", filepath.Base(path), st.Size(), took)
	t.Cleanup(func() { b.CheckClean(t, "file://"+page) })
	return page
}

// The flame graph and the table of call paths at the peak show report's
// peak: the same call paths (every frame) and bytes, per process.
func TestHTMLChromiumPeak(t *testing.T) {
	path := torchTrace(t)
	rep, err := report.Load(path, report.Options{Top: 100})
	if err != nil {
		t.Fatal(err)
	}
	b := browsertest.Shared(t)
	openHTML(t, b, path, Options{})
	b.Select(t, "#frames", "all") // every frame, as report has them
	for _, pid := range []uint32{7, 8} {
		b.Select(t, "#pid", fmt.Sprint(pid))
		got := b.PathRows(t, "#paths")
		var want []browsertest.PathRow
		var peak uint64
		for _, ps := range rep.PeakStacks {
			if ps.PID != pid {
				continue
			}
			r := browsertest.PathRow{Bytes: ps.LiveBytes}
			for _, f := range ps.Frames {
				r.Frames = append(r.Frames, browsertest.FrameText(f.Function, f.File, f.Line, f.Module, f.Address))
			}
			want = append(want, r)
			peak += ps.LiveBytes
		}
		for _, p := range rep.Processes {
			if p.PID == pid && p.PeakBytes != peak {
				t.Fatalf("pid %d: report's peak %d, its stacks %d", pid, p.PeakBytes, peak)
			}
		}
		key := func(r browsertest.PathRow) string { return fmt.Sprint(r.Bytes, r.Frames) }
		gotK, wantK := make([]string, len(got)), make([]string, len(want))
		for i := range got {
			gotK[i] = key(got[i])
		}
		for i := range want {
			wantK[i] = key(want[i])
		}
		slices.Sort(gotK)
		slices.Sort(wantK)
		if !slices.Equal(gotK, wantK) {
			t.Errorf("pid %d at the peak:\n page   %q\n report %q", pid, gotK, wantK)
		}
		if total := b.DataBytes(t, "#moment-title"); total != peak {
			t.Errorf("pid %d: the page says %d bytes at the peak, report %d", pid, total, peak)
		}
		// The flame graph: a rectangle for each of report's call paths
		// (root first, by each frame's short name), holding the bytes
		// of every stack through it.
		var rects []struct {
			Bytes uint64   `json:"bytes"`
			Path  []string `json:"path"`
		}
		b.Eval(t, `cudatrace.flameRects()`, &rects)
		flame := map[string]uint64{}
		for _, r := range rects {
			flame[strings.Join(r.Path, " > ")] = r.Bytes
		}
		through := map[string]uint64{}
		for _, ps := range rep.PeakStacks {
			if ps.PID != pid {
				continue
			}
			var p []string
			for i := len(ps.Frames) - 1; i >= 0; i-- {
				p = append(p, ps.Frames[i].Short())
				through[strings.Join(p, " > ")] += ps.LiveBytes
			}
		}
		for p, want := range through {
			if flame[p] != want {
				t.Errorf("pid %d: the flame graph holds %d bytes in %q, want %d", pid, flame[p], p, want)
			}
		}
		if rects[0].Bytes != peak {
			t.Errorf("pid %d: the flame graph's root holds %d, want %d", pid, rects[0].Bytes, peak)
		}
	}
}

// Selecting a range shows exactly what it left live (the leak: 2 MiB of
// tensors a step at train.py:66) and what each line added and removed,
// against the trace's own events in the range the page snapped to.
func TestHTMLChromiumRange(t *testing.T) {
	path := torchTrace(t)
	b := browsertest.Shared(t)
	openHTML(t, b, path, Options{})
	b.Select(t, "#pid", "7")
	b.Select(t, "#level", "1") // tensors
	var rng struct{ T0, T1 uint64 }
	rng.T0, rng.T1 = b.DragTime(t, 2_000*ms, 3_000*ms)
	if rng.T0 < 1_900*ms || rng.T0 > 2_100*ms || rng.T1 < 2_900*ms || rng.T1 > 3_100*ms {
		t.Fatalf("the range dragged is %d-%d ns, want about 2-3 s", rng.T0, rng.T1)
	}
	// The truth: pid 7's tensors made in [T0, T1) still live at T1, by
	// line, and each line's tensor bytes added and removed in it.
	t0, t1 := htmlBase+rng.T0, htmlBase+rng.T1
	left := map[*ledger.Allocation]uint64{}
	added, removed := map[string]uint64{}, map[string]uint64{}
	tr, err := replay.Read(path, replay.Options{OnEvent: func(ev *events.Event, ch ledger.Change) error {
		if ch.Process == nil || ch.Process.PID != 7 || ev.End() >= t1 {
			return nil
		}
		for a := range ch.AllFreed() {
			if a.API.Info().Layer == events.LayerTensor && ev.End() >= t0 {
				delete(left, a)
				removed[fmt.Sprint(a.Stack.Frames)] += a.Size
			}
		}
		if a := ch.Alloc; a != nil && a.API.Info().Layer == events.LayerTensor && ev.End() >= t0 {
			left[a] = a.Size
			added[fmt.Sprint(a.Stack.Frames)] += a.Size
		}
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	var leaked uint64
	for _, n := range left {
		leaked += n
	}
	if want := uint64(50 * torch.leakPerStep); leaked != want {
		t.Fatalf("the events say %d bytes leaked in the range, want 50 steps' %d", leaked, want)
	}
	if got := b.DataBytes(t, "#leak-total"); got != leaked {
		t.Errorf("the page says %d bytes were left live, the events %d", got, leaked)
	}
	leaks := b.PathRows(t, "#leaks")
	if len(leaks) != 1 || leaks[0].Bytes != leaked || leaks[0].Line != torch.leakLine || leaks[0].Count != "50" {
		t.Errorf("leak rows %+v, want one of %d bytes in 50 at %s", leaks, leaked, torch.leakLine)
	}
	// Per line: each line's rows sum the stacks through it.
	syms := tr.Symbols(true)
	defer syms.Close()
	wantLines := map[string][2]uint64{}
	for _, st := range tr.Ledger.Stacks() {
		if st.PID != 7 || !st.Tensor {
			continue
		}
		k := fmt.Sprint(st.Frames)
		if added[k]+removed[k] == 0 {
			continue
		}
		for _, line := range report.ViewKeys(report.Frames(syms.Frames(st)), report.ByLine) {
			v := wantLines[line]
			wantLines[line] = [2]uint64{v[0] + added[k], v[1] + removed[k]}
		}
	}
	var lines []struct {
		Added, Removed uint64
		Line           string
	}
	b.Eval(t, `[...document.querySelectorAll('#lines tr')].filter((tr) => tr.querySelector('td')).map((tr) => {
		const td = tr.querySelectorAll('td'); return {added: Number(td[0].dataset.bytes), removed: Number(td[1].dataset.bytes), line: td[5].textContent}; })`, &lines)
	gotLines := map[string][2]uint64{}
	for _, l := range lines {
		gotLines[l.Line] = [2]uint64{l.Added, l.Removed}
	}
	if fmt.Sprint(gotLines) != fmt.Sprint(wantLines) {
		t.Errorf("per line:\n page   %v\n events %v", gotLines, wantLines)
	}
	if v := gotLines[torch.leakLine]; v != [2]uint64{leaked, 0} {
		t.Errorf("%s added %d and removed %d, want %d and 0", torch.leakLine, v[0], v[1], leaked)
	}
}

// The failure: listed with what its device held, and its live set (the
// page's own snapshot) is what report says was live then.
func TestHTMLChromiumFailure(t *testing.T) {
	path := torchTrace(t)
	rep, err := report.Load(path, report.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Failures) != 1 {
		t.Fatalf("report lists %d failures", len(rep.Failures))
	}
	f := rep.Failures[0]
	b := browsertest.Shared(t)
	openHTML(t, b, path, Options{})
	b.Tab(t, "failures")
	var row []string
	b.Eval(t, `[...document.querySelectorAll('#failures tr')[1].querySelectorAll('td')].map((td) => td.dataset.bytes || td.textContent)`, &row)
	if len(row) < 8 || row[1] != "pid 7" || row[2] != "cudaMalloc" || row[3] != fmt.Sprint(torch.oomSize) ||
		row[5] != "cudaErrorMemoryAllocation (2)" || row[6] != fmt.Sprint(f.DeviceLiveBytes) || row[7] != fmt.Sprint(f.LiveBytes) {
		t.Errorf("failure row %q, report: %+v", row, f)
	}
	b.Eval(t, `document.querySelector('#failures tr:nth-child(2) button').click()`, nil)
	if got := b.DataBytes(t, "#moment-title"); got != f.LiveBytes {
		t.Errorf("the live set when it failed holds %d bytes, report says %d", got, f.LiveBytes)
	}
	if title := b.Text(t, "#moment-title"); !strings.Contains(title, "when an allocation failed") {
		t.Errorf("moment title %q", title)
	}
}

// Filters, search and zoom: a device's series, the bytes a search
// matches, a frame zoomed to the full width.
func TestHTMLChromiumControls(t *testing.T) {
	path := torchTrace(t)
	b := browsertest.Shared(t)
	openHTML(t, b, path, Options{})
	// Every process at the peak: both ranks' NCCL buffers match "nccl".
	b.Type(t, "#search", "libnccl")
	if got, want := b.Text(t, "#search-result"), "matched 128.0 MiB"; !strings.HasPrefix(got, want) {
		t.Errorf("search: %q, want %q…", got, want)
	}
	b.Select(t, "#dev", "1")
	if got := b.Text(t, "#summary"); !strings.Contains(got, "of every process on GPU 1: peak 1.5 GiB") {
		t.Errorf("summary on GPU 1: %q", got)
	}
	// Zoom: click the rectangle of train.py:66's frame.
	var r struct{ X, Y, W float64 }
	b.Eval(t, `(() => { const c = document.getElementById('flame').getBoundingClientRect();
		const r = cudatrace.flameRects().find((r) => r.frame === 'train_step (train.py:66)');
		return {x: c.left + r.x + r.w / 2, y: c.top + r.y + 9, w: r.w}; })()`, &r)
	b.Click(t, r.X, r.Y)
	var zoomed struct {
		W     float64
		Width float64
	}
	b.Eval(t, `(() => { const r = cudatrace.flameRects().find((r) => r.frame === 'train_step (train.py:66)');
		return {w: r.w, width: document.getElementById('flame').clientWidth}; })()`, &zoomed)
	if zoomed.W < zoomed.Width-1 || r.W >= zoomed.Width-1 {
		t.Errorf("train.py:66 was %.0f px wide, %.0f once clicked, of %.0f", r.W, zoomed.W, zoomed.Width)
	}
}

// Pages of other traces load with no error: an OOM trace whose frames are
// not named, a trace that starts with memory live before it (an agent's
// window, frees of memory allocated before), and a large one.
func TestHTMLChromiumTraces(t *testing.T) {
	b := browsertest.Shared(t)
	t.Run("oom", func(t *testing.T) {
		openHTML(t, b, htmlTrace(t), Options{NoSymbolize: true})
		if n := b.Text(t, "#failures-title"); !strings.HasPrefix(n, "1 allocation failed;") {
			t.Errorf("failures: %q", n)
		}
	})
	t.Run("attached", func(t *testing.T) {
		before := func(tm float64, addr, size uint64, frame uint64) events.Event {
			ev := htmlEv(tm, events.CudaMalloc, addr, size, 0, frame)
			ev.Flags |= events.FlagBefore
			return ev
		}
		path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase},
			&tracefile.Process{PID: 7, Comm: "train", Time: htmlBase},
			before(0, 0x1000_0000, 300*mib, frameWeights),
			before(0, 0x2000_0000, 20*mib, frameStep),
			htmlEv(1, events.CudaFree, 0x2000_0000, 0, 0, 0),
			htmlEv(2, events.CudaFree, 0x6000_0000, 0, 0, 0), // made before, unseen: an unknown free
			htmlEv(3, events.CudaMalloc, 0x3000_0000, 10*mib, 0, frameStep),
			htmlEv(4, events.CudaMalloc, 0x4000_0000, 2*mib, events.DeviceUnknown, frameStep),
			&tracefile.Counters{Time: htmlBase + 5*ms, Lost: 3, Counters: map[string]uint64{"ringbuf_full": 3}},
			&tracefile.End{Time: htmlBase + 5*ms})
		openHTML(t, b, path, Options{NoSymbolize: true})
		b.Eval(t, `document.getElementById('go-start').click()`, nil)
		title := b.Text(t, "#moment-title")
		if got := b.DataBytes(t, "#moment-title"); got != 320*mib || !strings.Contains(title, "320.0 MiB of it live before tracing began") {
			t.Errorf("at the start: %d bytes, %q", got, title)
		}
		b.DragTime(t, 0, 5*ms)
		if got := b.DataBytes(t, "#leak-total"); got != 12*mib {
			t.Errorf("left live by the trace: %d bytes, want only what it made (%d)", got, 12*mib)
		}
		// What the figures miss is said at the top, never hidden.
		var notes []struct {
			Warn bool
			Text string
		}
		b.Eval(t, `[...document.querySelectorAll('#notes li')].map((li) => ({warn: li.className === 'warn', text: li.textContent}))`, &notes)
		var lost, unknown bool
		for _, n := range notes {
			lost = lost || n.Warn && strings.HasPrefix(n.Text, "WARNING: 3 EVENTS WERE LOST (ringbuf_full 3)")
			unknown = unknown || strings.Contains(n.Text, "held up to 2.0 MiB on an unknown device")
		}
		if !lost || !unknown {
			t.Errorf("notes %+v: want the losses (a warning) and the unknown device's memory", notes)
		}
		b.Select(t, "#dev", "-1")
		if got := b.Text(t, "#summary"); !strings.Contains(got, "on the unknown device: peak 2.0 MiB") {
			t.Errorf("the unknown device's series: %q", got)
		}
	})
	t.Run("empty", func(t *testing.T) {
		path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase},
			&tracefile.Process{PID: 7, Comm: "train", Time: htmlBase}, &tracefile.End{Time: htmlBase + 5*ms})
		openHTML(t, b, path, Options{NoSymbolize: true})
		if got := b.Text(t, "#summary"); got != "nothing traced for every process on every device" {
			t.Errorf("summary of an empty trace: %q", got)
		}
	})
	t.Run("big", func(t *testing.T) {
		n := 1_000_000
		if v, _ := strconv.Atoi(os.Getenv("CUDATRACE_HTML_EVENTS")); v > 0 {
			n = v
		}
		path := filepath.Join(t.TempDir(), "big.trace")
		leaks := tracetest.WriteBig(t, path, tracetest.Big{Events: n, Stacks: 1000, Depth: 20, Window: 500, LeakEvery: 100_000, StepNS: 1000})
		page := openHTML(t, b, path, Options{NoSymbolize: true})
		st, err := os.Stat(page)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 20<<20 {
			t.Errorf("a page of %d events is %d bytes, more than 20 MiB", n, st.Size())
		}
		// Every leak is left live at the end by the whole trace.
		b.Eval(t, `document.getElementById('range-clear').click()`, nil)
		if got, want := b.DataBytes(t, "#leak-total"), uint64(leaks*tracetest.BigLeakSize); got != want {
			t.Errorf("the whole trace left %d bytes live, want %d leaks' %d", got, leaks, want)
		}
	})
}
