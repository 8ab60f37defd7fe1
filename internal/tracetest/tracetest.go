// Package tracetest writes trace files for tests: a sequence of events and
// frames, as the recorder would have written them.
package tracetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Write writes items (events.Event and the tracefile frame types, by
// pointer) to a new trace file in a temporary directory. It returns the
// path and the file's size after each item, for tests that cut it short.
func Write(t testing.TB, meta tracefile.Meta, items ...any) (string, []int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.trace")
	w, err := tracefile.Create(path, meta)
	if err != nil {
		t.Fatal(err)
	}
	var ends []int64
	for _, it := range items {
		switch v := it.(type) {
		case events.Event:
			err = w.WriteEvent(events.Encode(nil, &v))
		case *tracefile.Process:
			err = w.WriteProcess(v)
		case *tracefile.Attach:
			err = w.WriteAttach(v)
		case *tracefile.Counters:
			err = w.WriteCounters(v)
		case *tracefile.End:
			err = w.WriteEnd(v)
		case *tracefile.NVML:
			err = w.WriteNVML(v)
		case *tracefile.Symbols:
			err = w.WriteSymbols(v)
		default:
			t.Fatalf("tracetest.Write: %T", it)
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, st.Size())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return path, ends
}
