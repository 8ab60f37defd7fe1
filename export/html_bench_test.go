package export

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/internal/browsertest"
	"github.com/cudatrace/cudatrace/internal/tracetest"
)

// BenchmarkHTMLPage: the page of a trace of 10M events (CUDATRACE_HTML_EVENTS
// others): one process, 1000 stacks of 20 frames on two devices, each
// allocation freed 500 later, a leak every 100000th, without
// symbolization. Reported: the trace's and the page's bytes, the export's
// time beside the pprof export's of the same file (one replay, the floor
// of any export) in the same run, and how long headless Chromium takes to
// open the page and have its script ready; it fails on any JavaScript
// error.
func BenchmarkHTMLPage(b *testing.B) {
	n := 10_000_000
	if v, _ := strconv.Atoi(os.Getenv("CUDATRACE_HTML_EVENTS")); v > 0 {
		n = v
	}
	dir := b.TempDir()
	path := filepath.Join(dir, "big.trace")
	tracetest.WriteBig(b, path, tracetest.Big{Events: n, Stacks: 1000, Depth: 20, Window: 500, LeakEvery: 100_000, StepNS: 1000})
	page := filepath.Join(dir, "big.html")
	br := browsertest.Start(b)
	for b.Loop() {
		t0 := time.Now()
		if err := WritePprof(io.Discard, path, Options{NoSymbolize: true}); err != nil {
			b.Fatal(err)
		}
		pprof := time.Since(t0)
		f, err := os.Create(page)
		if err != nil {
			b.Fatal(err)
		}
		t0 = time.Now()
		if err := WriteHTML(f, path, Options{NoSymbolize: true}); err != nil {
			b.Fatal(err)
		}
		html := time.Since(t0)
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		ready := br.Open(b, "file://"+page, 2*time.Minute)
		br.CheckClean(b, "file://"+page)
		tst, _ := os.Stat(path)
		pst, _ := os.Stat(page)
		b.ReportMetric(float64(tst.Size())/(1<<20), "trace-MiB")
		b.ReportMetric(float64(pst.Size())/(1<<20), "page-MiB")
		b.ReportMetric(html.Seconds(), "export-s")
		b.ReportMetric(html.Seconds()/pprof.Seconds(), "export/pprof")
		b.ReportMetric(ready.Seconds(), "open-s")
	}
}
