// Package perfettotest reads a Chrome trace-event document (what
// `cudatrace export --format perfetto` writes) as ui.perfetto.dev does,
// for tests: it checks what a viewer relies on and returns what the
// tests compare with their ground truth.
package perfettotest

import (
	"encoding/json"
	"fmt"
	"testing"
)

// Timeline is what a document shows.
type Timeline struct {
	// Names are the processes' titles (process_name), by PID.
	Names map[uint32]string
	// Sort are the processes' sort indexes (process_sort_index), by PID.
	Sort map[uint32]int
	// Last is each counter track's last value, by "PID/name".
	Last map[string]float64
}

// Check decodes data and checks it as a viewer reads it: every event of a
// phase cudatrace writes (M, C, i), each process named once and every
// process with events named, each counter track's times never going
// back (a viewer sorts by time: an earlier stamp would leave the wrong
// value standing).
func Check(t testing.TB, data []byte) Timeline {
	t.Helper()
	var doc struct {
		TraceEvents []struct {
			Ph   string         `json:"ph"`
			Name string         `json:"name"`
			PID  uint32         `json:"pid"`
			TS   float64        `json:"ts"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("not trace-event JSON: %v", err)
	}
	tl := Timeline{Names: map[uint32]string{}, Sort: map[uint32]int{}, Last: map[string]float64{}}
	ts, used := map[string]float64{}, map[uint32]bool{}
	for _, e := range doc.TraceEvents {
		switch e.Ph {
		case "M":
			switch e.Name {
			case "process_name":
				if _, dup := tl.Names[e.PID]; dup {
					t.Errorf("pid %d named twice", e.PID)
				}
				tl.Names[e.PID], _ = e.Args["name"].(string)
			case "process_sort_index":
				v, _ := e.Args["sort_index"].(float64)
				tl.Sort[e.PID] = int(v)
			case "thread_name":
			default:
				t.Errorf("metadata event %q", e.Name)
			}
		case "C":
			k := fmt.Sprintf("%d/%s", e.PID, e.Name)
			if e.TS < ts[k] {
				t.Errorf("%s: a value at %v after one at %v", k, e.TS, ts[k])
			}
			v, ok := e.Args["live_bytes"].(float64)
			if !ok {
				t.Errorf("%s: a counter without live_bytes: %v", k, e.Args)
			}
			ts[k], tl.Last[k] = e.TS, v
			used[e.PID] = true
		case "i":
			used[e.PID] = true
		default:
			t.Errorf("event of phase %q", e.Ph)
		}
	}
	for pid := range used {
		if tl.Names[pid] == "" {
			t.Errorf("pid %d has events and no name", pid)
		}
	}
	return tl
}
