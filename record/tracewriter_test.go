package record

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
	"github.com/cudatrace/cudatrace/tracefile"
)

// TestTraceWriter: the metadata names this machine, each native frame is
// named once whatever the number of WriteNames calls, and Finish ends the
// file with the counters and the end frame, both stamped.
func TestTraceWriter(t *testing.T) {
	meta := TraceMeta("cudatrace test")
	host, _ := os.Hostname()
	if meta.Tool != "cudatrace test" || meta.Host != host || meta.Kernel == "" || meta.StartBoot == 0 || meta.StartWall.IsZero() {
		t.Errorf("meta %+v", meta)
	}
	var buf bytes.Buffer
	w, err := NewTraceWriter(&buf, meta)
	if err != nil {
		t.Fatal(err)
	}
	a := procmodel.Symbol{BuildID: "ab", Offset: 0x10, Frame: symbolize.Frame{Function: "f"}}
	b := procmodel.Symbol{BuildID: "ab", Offset: 0x20, Frame: symbolize.Frame{Function: "g"}}
	c := procmodel.Symbol{BuildID: "cd", Offset: 0x10, Frame: symbolize.Frame{Function: "h"}}
	for _, names := range [][]procmodel.Symbol{{a, b, a}, {b}, {c, a}, nil} {
		if err := w.WriteNames(names); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Finish(tracefile.Counters{Lost: 3}, tracefile.End{Events: 7, Reason: "done"}); err != nil {
		t.Fatal(err)
	}

	r, err := tracefile.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	var end *tracefile.End
	var counters *tracefile.Counters
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case rec.Symbols != nil:
			frames := ""
			for _, f := range rec.Symbols.Frames {
				frames += f.Function
			}
			named = append(named, frames)
		case rec.Counters != nil:
			counters = rec.Counters
		case rec.End != nil:
			end = rec.End
		}
	}
	if len(named) != 2 || named[0] != "fg" || named[1] != "h" {
		t.Errorf("symbols frames %q, want [fg h]: each frame once, no empty frame", named)
	}
	if counters == nil || counters.Lost != 3 || counters.Time < meta.StartBoot {
		t.Errorf("counters %+v", counters)
	}
	if end == nil || end.Events != 7 || end.Reason != "done" || end.Time < meta.StartBoot {
		t.Errorf("end %+v", end)
	}
}
