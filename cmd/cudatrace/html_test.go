package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/tracetest"
	"github.com/cudatrace/cudatrace/tracefile"
)

// report's text ends saying how to get the page, and export --format html
// writes it: one file with its data, its script and its style.
func TestHTMLVerbs(t *testing.T) {
	const base = 1_000_000_000
	path, _ := tracetest.Write(t, tracefile.Meta{Tool: "t", StartBoot: base},
		&tracefile.Process{PID: 7, Comm: "train", Time: base},
		events.Event{Time: base + 1000, Duration: 10, PID: 7, TID: 7, Comm: "train", API: events.CudaMalloc,
			Addr: 0x1000, Size: 4096, Stack: []uint64{0xa1}},
		&tracefile.End{Time: base + 5000})
	code, stdout, stderr := runCLI("report", path, "--no-symbolize")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if want := "To look at it: cudatrace export " + path + " --format html -o report.html, and open report.html in a browser"; code != 0 || !strings.HasPrefix(lines[len(lines)-1], want) {
		t.Errorf("report: exit %d, its last line %q, want it to begin %q\n%s", code, lines[len(lines)-1], want, stderr)
	}
	out := filepath.Join(t.TempDir(), "page.html")
	if code, _, stderr := runCLI("export", path, "--format", "html", "--no-symbolize", "-o", out); code != 0 {
		t.Fatalf("export html: exit %d\n%s", code, stderr)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<!DOCTYPE html>", `<script id="data" type="application/json">{"version":1,`, "window.cudatrace",
		"Content-Security-Policy", "<title>cudatrace: test.trace</title>"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(string(page), "http://") || strings.Contains(string(page), "https://") {
		t.Error("the page names a URL: it must fetch nothing")
	}
}
