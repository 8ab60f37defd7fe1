package export

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/browsertest"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/tracefile"
)

// burstTrace: 100 MiB live for 10 s, then a burst of 40 allocations of
// 1 MiB in the last 4% (every 10 ms from 9.6 s), every other one freed
// 5 ms later; and 2500 failed allocations spread over the whole run.
func burstTrace(t testing.TB) string {
	const s = 1000 * ms
	items := []any{&tracefile.Process{PID: 7, Comm: "train", Time: htmlBase},
		htmlEv(0, events.CudaMalloc, 0x1000_0000, 100*mib, 0, frameWeights)}
	var evs []events.Event
	for i := range 2500 {
		ev := htmlEv(float64(i)*4, events.CudaMalloc, 0, 1<<40, 0, frameOOM)
		ev.Result = 2
		evs = append(evs, ev)
	}
	for i := range 40 {
		tm := float64(9600 + i*10)
		evs = append(evs, htmlEv(tm, events.CudaMalloc, uint64(0x2000_0000+i<<24), mib, 0, frameStep))
		if i%2 == 1 {
			evs = append(evs, htmlEv(tm+5, events.CudaFree, uint64(0x2000_0000+i<<24), 0, 0, 0))
		}
	}
	slices.SortStableFunc(evs, func(a, b events.Event) int { return int(a.Time) - int(b.Time) })
	for _, ev := range evs {
		items = append(items, ev)
	}
	items = append(items, &tracefile.End{Time: htmlBase + 10*s})
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "test", StartBoot: htmlBase, Host: "h"}, items...)
	return path
}

// pprofInuseAt is export --format pprof --at d's live bytes (inuse_space).
func pprofInuseAt(t *testing.T, path string, d time.Duration) uint64 {
	t.Helper()
	var buf bytes.Buffer
	if err := WritePprof(&buf, path, Options{At: Moment{At: d}}); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, s := range p.Sample {
		n += s.Value[3]
	}
	return uint64(n)
}

// Which one: zoomed in, each allocation of a short burst is drawn and the
// live set at a click inside it is export --at's; every failure is drawn,
// not the first 2000; distinct paths, APIs and processes read distinctly;
// the Range tab names the user's line; figures sit under their headings.
func TestHTMLChromiumWhichOne(t *testing.T) {
	b := browsertest.Shared(t)
	t.Run("zoom", func(t *testing.T) {
		path := burstTrace(t)
		openHTML(t, b, path, Options{})
		var marks int
		b.Eval(t, `cudatrace.failureMarks()`, &marks)
		if marks != 2500 {
			t.Errorf("the chart marks %d failures, want all 2500", marks)
		}
		// Drag across the burst: the chart zooms to it, and draws each
		// of its 40 allocations.
		b.DragTime(t, 9590*ms, 10000*ms)
		var v struct{ T0, T1 float64 }
		b.Eval(t, `cudatrace.view()`, &v)
		if v.T0 < 9500*ms || v.T1 > 10000*ms {
			t.Errorf("after the drag the chart shows %v to %v ns", v.T0, v.T1)
		}
		var steps []struct{ T, Bytes int64 }
		b.Eval(t, `cudatrace.steps()`, &steps)
		allocs := 0
		for _, s := range steps {
			if s.Bytes > 0 {
				allocs++
			}
		}
		if allocs != 40 {
			t.Errorf("zoomed in, the chart draws %d allocations of the burst, want 40 (%d steps)", allocs, len(steps))
		}
		// A click between the 21st allocation and the next: the live set
		// then is exactly export --at's.
		at := b.ClickTime(t, 9600*ms+20*10*ms+7*ms)
		want := pprofInuseAt(t, path, time.Duration(at))
		if got := b.DataBytes(t, "#moment-title"); got != want || want != 100*mib+11*mib {
			t.Errorf("the live set at %d ns: page %d bytes, export --at %d (want %d)", at, got, want, 100*mib+11*mib)
		}
		// The tooltip at the chart's right edge stays inside the page.
		var wide struct{ Scroll, Client float64 }
		b.Eval(t, `(() => { const c = document.getElementById('timeline'), r = c.getBoundingClientRect();
			c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.right - 3, clientY: r.top + 60, bubbles: true}));
			return {scroll: document.documentElement.scrollWidth, client: document.documentElement.clientWidth}; })()`, &wide)
		if wide.Scroll > wide.Client {
			t.Errorf("the tooltip widens the page: %v > %v", wide.Scroll, wide.Client)
		}
		b.Eval(t, `document.getElementById('zoom-out').click()`, nil)
		b.Eval(t, `cudatrace.view()`, &v)
		if v.T0 != 0 || v.T1 < 9990*ms {
			t.Errorf("zoomed out, the chart shows %v to %v ns", v.T0, v.T1)
		}
	})
	t.Run("labels", func(t *testing.T) {
		openHTML(t, b, labelsTrace(t), Options{})
		var labels []string
		b.Eval(t, `cudatrace.labels()`, &labels)
		if len(labels) != 16 {
			t.Fatalf("%d paths: %q", len(labels), labels)
		}
		seen := map[string]bool{}
		for _, l := range labels {
			if seen[l] {
				t.Errorf("two paths labelled %q", l)
			}
			seen[l] = true
		}
		// The table at the end, every process: each row's label its own.
		b.Eval(t, `document.getElementById('go-end').click()`, nil)
		var rows []string
		b.Eval(t, `[...document.querySelectorAll('#paths td.path summary')].map((s) => s.textContent)`, &rows)
		if len(rows) != 16 || len(slices.Compact(slices.Sorted(slices.Values(rows)))) != 16 {
			t.Errorf("the paths table's labels %q, want 16 distinct", rows)
		}
		for _, l := range rows {
			if strings.HasPrefix(l, "cuda_malloc") {
				t.Errorf("label %q starts with the helper every path shares", l)
			}
		}
		if !slices.Contains(rows, "worker ← main (app.c:50) · cudaMallocAsync · pid 8") {
			t.Errorf("no label tells worker's cudaMallocAsync of pid 8 apart: %q", rows)
		}
		// The Range tab, the whole trace: the leak's line is the user's.
		b.Tab(t, "range")
		var lines map[string]string
		b.Eval(t, `Object.fromEntries([...document.querySelectorAll('#leaks tr')].slice(1).map((tr) => [tr.querySelector('summary').textContent, tr.querySelector('td.line').textContent]))`, &lines)
		for l, want := range map[string]string{"worker_b (app.c:30) ← main (app.c:50) · via cuda_malloc · pid 7": "/src/app.c:30", "leaky ← run · pid 7": "leaky"} {
			if lines[l] != want {
				t.Errorf("the Range tab's line of %q is %q, want %q (%q)", l, lines[l], want, lines)
			}
		}
		// Sizes as report writes them (half to even), times never "1000.0 ms".
		for n, want := range map[uint64]string{5 << 28: units.Bytes(5 << 28), 1<<30 + 1<<26: units.Bytes(1<<30 + 1<<26), 3 << 19: units.Bytes(3 << 19)} {
			var got string
			b.Eval(t, fmt.Sprintf(`cudatrace.fmt.bytes(%d)`, n), &got)
			if got != want {
				t.Errorf("the page writes %d bytes %q, report %q", n, got, want)
			}
		}
		for ns, want := range map[float64]string{999.96e6: "1.000 s", 999.96e3: "1.000 ms", 59.99e9: "60.0 s"} {
			var got string
			b.Eval(t, fmt.Sprintf(`cudatrace.fmt.time(%v)`, ns), &got)
			if got != want {
				t.Errorf("the page writes %v ns %q, want %q", ns, got, want)
			}
		}
		// The flame graph zoomed to worker_b's frame: the table lists the
		// paths through it only.
		b.Tab(t, "moment")
		b.Eval(t, `(() => { cudatrace.state.zoom = [];
			const r = cudatrace.flameRects().find((r) => r.frame === 'worker_b (app.c:30)');
			const c = document.getElementById('flame').getBoundingClientRect();
			document.getElementById('flame').dispatchEvent(new MouseEvent('click', {clientX: c.left + r.x + 2, clientY: c.top + r.y + 9, bubbles: true}));
			cudatrace.render(); })()`, nil)
		b.Eval(t, `[...document.querySelectorAll('#paths td.path summary')].map((s) => s.textContent)`, &rows)
		if len(rows) != 2 || !strings.HasPrefix(rows[0], "worker_b") || !strings.HasPrefix(rows[1], "worker_b") {
			t.Errorf("zoomed to worker_b, the table lists %q", rows)
		}
		// Figures under their headings, in every tab.
		for _, tab := range []string{"moment", "range", "failures", "processes"} {
			b.Tab(t, tab)
			if bad := b.Misaligned(t, "table.rows"); len(bad) > 0 {
				t.Errorf("%s: figures not under their headings: %q", tab, bad)
			}
		}
	})
}
