package export

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/internal/browsertest"
)

// TestHTMLScreenshots writes the screenshots the docs show, of the page
// of torchTrace (a synthetic two-rank PyTorch-shaped job), into the
// directory CUDATRACE_SCREENSHOTS names: `CUDATRACE_SCREENSHOTS=$PWD/docs/img
// go test -run TestHTMLScreenshots ./export/`. Without it, it does nothing.
func TestHTMLScreenshots(t *testing.T) {
	dir := os.Getenv("CUDATRACE_SCREENSHOTS")
	if dir == "" {
		t.Skip("CUDATRACE_SCREENSHOTS names no directory to write the screenshots to")
	}
	// Named as a user's would be.
	data, err := os.ReadFile(torchTrace(t))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "train.trace")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	b := browsertest.Shared(t)
	openHTML(t, b, path, Options{})
	shot := func(sel, name string) { b.Screenshot(t, sel, filepath.Join(dir, name)) }
	// The page as it opens: memory over time by owner, the flame graph at
	// the peak.
	shot("", "html-overview.png")
	// By call path, rank 0, with a search.
	b.Select(t, "#pid", "7")
	b.Select(t, "#split", "path")
	b.Type(t, "#search", "train.py:66")
	shot("", "html-paths-search.png")
	// Zoomed to three steps, tensors: each allocation and free, and the
	// live set at a click between two of them.
	b.Select(t, "#level", "1")
	b.Eval(t, `document.getElementById('search').value = ''; document.getElementById('search').dispatchEvent(new Event('input'))`, nil)
	b.DragTime(t, 2_010*ms, 2_070*ms)
	b.ClickTime(t, 2_032*ms)
	b.Eval(t, `document.getElementById('tip').hidden = true`, nil)
	shot("", "html-zoom.png")
	// A range over steps 100 to 150: what it left live, per line.
	b.DragTime(t, 2_000*ms, 3_000*ms)
	b.Tab(t, "range")
	b.Eval(t, `document.getElementById('tip').hidden = true; window.scrollTo(0, document.getElementById('tabs').offsetTop - 8)`, nil)
	shot("", "html-range.png")
	b.Eval(t, `window.scrollTo(0, 0)`, nil)
	b.Select(t, "#level", "0")
	b.Tab(t, "failures")
	shot("#tab-failures", "html-failures.png")
	b.Eval(t, `document.querySelector('#failures tr:nth-child(2) button').click()`, nil)
	shot("", "html-failure-live.png")
	b.Tab(t, "processes")
	shot("#tab-processes", "html-processes.png")
}
