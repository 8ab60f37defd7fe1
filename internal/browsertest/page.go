package browsertest

// page.go: reading cudatrace's page (export/htmlpage) as a user sees it:
// its tables of call paths, the exact byte counts its cells carry
// (data-bytes), its selects, and a range dragged on its timeline.

import (
	"fmt"
	"strconv"
	"testing"
)

// PathRow is a row of one of the page's tables of call paths: its bytes,
// its count and line cells, and its frames' text, innermost first.
type PathRow struct {
	Bytes  uint64   `json:"bytes"`
	Count  string   `json:"count"`
	Line   string   `json:"line"`
	Frames []string `json:"frames"`
}

// PathRows reads the call-path rows of the table sel, those past the
// first shown included.
func (b *Browser) PathRows(t testing.TB, sel string) []PathRow {
	t.Helper()
	var out []PathRow
	b.Eval(t, `(() => {
		const more = document.querySelector('`+sel+` tr.more button'); if (more) more.click();
		return [...document.querySelectorAll('`+sel+` tr')].filter((tr) => tr.querySelector('td[data-bytes]')).map((tr) => ({
			bytes: Number(tr.querySelector('td[data-bytes]').dataset.bytes),
			count: (tr.querySelector('td.count') || {}).textContent || '',
			line: (tr.querySelector('td.line') || {}).textContent || '',
			frames: [...tr.querySelectorAll('td.path li')].map((li) => li.textContent)}));
	})()`, &out)
	return out
}

// Select sets the select (or input) sel to value, as a user picks it.
func (b *Browser) Select(t testing.TB, sel, value string) {
	t.Helper()
	b.Eval(t, `(() => { const e = document.querySelector('`+sel+`'); e.value = '`+value+`';
		e.dispatchEvent(new Event('change')); return e.value; })()`, nil)
}

// Text is the text of the element sel.
func (b *Browser) Text(t testing.TB, sel string) string {
	t.Helper()
	var s string
	b.Eval(t, `document.querySelector('`+sel+`').textContent`, &s)
	return s
}

// DataBytes is the exact byte count the element sel carries.
func (b *Browser) DataBytes(t testing.TB, sel string) uint64 {
	t.Helper()
	s := b.Text(t, sel) // fails t where there is no such element
	b.Eval(t, `document.querySelector('`+sel+`').dataset.bytes`, &s)
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: data-bytes %q", sel, s)
	}
	return n
}

// Tab shows the page's tab (moment, range, failures, processes, about).
func (b *Browser) Tab(t testing.TB, tab string) {
	t.Helper()
	b.Eval(t, `document.querySelector('#tabs button[data-tab=`+tab+`]').click()`, nil)
}

// DragTime selects on the page's timeline the range from t0 to t1 (ns
// since the page's start), dragging the mouse across it as a user does,
// and returns the range the page snapped it to.
func (b *Browser) DragTime(t testing.TB, t0, t1 uint64) (from, to uint64) {
	t.Helper()
	var pos struct{ X0, X1, Y float64 }
	// From the whole trace: a drag zooms the chart to the window, and the
	// Range tab follows it (the whole trace: no range).
	b.Eval(t, fmt.Sprintf(`(() => { const z = document.getElementById('zoom-all'); if (z && !z.disabled) z.click();
		const r = document.getElementById('timeline').getBoundingClientRect();
		return {x0: r.left + cudatrace.xOfT(%d), x1: r.left + cudatrace.xOfT(%d), y: r.top + r.height / 2}; })()`, t0, t1), &pos)
	b.Drag(t, pos.X0, pos.X1, pos.Y)
	var rng struct{ T0, T1 uint64 }
	b.Eval(t, `(() => { const r = cudatrace.state.range; return r ? {t0: cudatrace.tOfJ(r.j0), t1: cudatrace.tOfJ(r.j1)} : {t0: 0, t1: cudatrace.tOfJ(cudatrace.endJ())}; })()`, &rng)
	if rng.T1 == 0 {
		t.Fatalf("dragging from %d to %d ns selected no range", t0, t1)
	}
	return rng.T0, rng.T1
}

// CheckClean fails t on the page's JavaScript errors, and on requests
// for anything but the URLs allowed (the page itself, its data).
func (b *Browser) CheckClean(t testing.TB, allowed ...string) {
	t.Helper()
	if errs := b.Errors(); len(errs) > 0 {
		t.Errorf("JavaScript errors: %q", errs)
	}
	for _, r := range b.Requests() {
		ok := false
		for _, a := range allowed {
			ok = ok || r == a
		}
		if !ok {
			t.Errorf("the page requested %s: it may fetch nothing but %q", r, allowed)
		}
	}
}

// FrameText is how the page's lists of frames show a frame: its function
// (else its address), then its file and line, or else its module.
func FrameText(function, file string, line int, module, address string) string {
	name := function
	if name == "" {
		name = address
	}
	switch {
	case file != "":
		return fmt.Sprintf("%s (%s:%d)", name, file, line)
	case module != "":
		return name + " " + module
	}
	return name
}

// ClickTime clicks the chart at t ns (in the window it shows), and
// returns the moment the page chose: its time in ns.
func (b *Browser) ClickTime(t testing.TB, tm uint64) uint64 {
	t.Helper()
	var pos struct{ X, Y float64 }
	b.Eval(t, fmt.Sprintf(`(() => { const r = document.getElementById('timeline').getBoundingClientRect();
		return {x: r.left + cudatrace.xOfT(%d), y: r.top + r.height / 2}; })()`, tm), &pos)
	b.Click(t, pos.X, pos.Y)
	var m struct{ Kind string }
	var at uint64
	b.Eval(t, `cudatrace.state.moment`, &m)
	if m.Kind != "t" {
		t.Fatalf("clicking at %d ns chose a moment of kind %q, not an exact time", tm, m.Kind)
	}
	b.Eval(t, `cudatrace.state.moment.t`, &at)
	return at
}

// Misaligned lists the cells of the tables under sel whose figures do not
// sit under their heading: a right-aligned figure's right edge against
// its heading's text's, a left-aligned one's left edge likewise (within
// two pixels), as "table: heading: cell".
func (b *Browser) Misaligned(t testing.TB, sel string) []string {
	t.Helper()
	var out []string
	b.Eval(t, fmt.Sprintf(`(() => {
		const edge = (el) => { const r = document.createRange(); r.selectNodeContents(el); const b = r.getBoundingClientRect(); return [b.left, b.right]; };
		const out = [];
		for (const tb of document.querySelectorAll(%q)) {
			const head = [...tb.querySelectorAll('tr:first-child th')];
			for (const tr of [...tb.querySelectorAll('tr')].slice(1, 6)) {
				const tds = [...tr.children];
				if (tds.length !== head.length) continue;
				tds.forEach((td, i) => {
					if (td.textContent === '' || head[i].textContent === '' || td.offsetParent === null) return;
					const [hl, hr] = edge(head[i]), [dl, dr] = edge(td);
					const right = getComputedStyle(td).textAlign === 'right';
					if (right ? Math.abs(hr - dr) > 2 : Math.abs(hl - dl) > 2) out.push(tb.id + ': ' + head[i].textContent + ': ' + td.textContent);
				});
			}
		}
		return out; })()`, sel), &out)
	return out
}
