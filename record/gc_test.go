package record

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// gcPercent reads the collector's percent without changing it.
func gcPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

// While a recording runs with a headroom, the collector runs at
// recordGCPercent within a memory limit of Go's default target plus the
// headroom, and has its settings back after; GOGC or GOMEMLIMIT set by the
// user, or no headroom, leave them alone.
func TestTuneGC(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	percent, limit := gcPercent(), debug.SetMemoryLimit(-1)
	const headroom = 256 << 20
	g := tuneGC(headroom)
	if g == nil {
		t.Fatal("tuneGC(256 MiB) changed nothing")
	}
	if p := gcPercent(); p != recordGCPercent {
		t.Errorf("GC percent %d while recording, want %d", p, recordGCPercent)
	}
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	live, total := int64(s[0].Value.Uint64()), int64(s[1].Value.Uint64())
	got := debug.SetMemoryLimit(-1)
	// At least the default target (twice the live heap) plus the
	// headroom, and no more than that plus what the runtime holds beside
	// its heap.
	if got != g.lastLimit || got < 2*live+headroom || got > 2*live+total+headroom {
		t.Errorf("memory limit %d while recording (set %d); want from 2*%d+%d to that plus %d", got, g.lastLimit, live, headroom, total)
	}
	g.stop()
	if p, l := gcPercent(), debug.SetMemoryLimit(-1); p != percent || l != limit {
		t.Errorf("after the recording: GC percent %d, memory limit %d; want %d, %d as before", p, l, percent, limit)
	}
	if limit != math.MaxInt64 {
		t.Logf("the test process had a memory limit of %d", limit)
	}

	for _, c := range []struct {
		env, val string
		headroom uint64
	}{{"GOGC", "150", headroom}, {"GOMEMLIMIT", "1GiB", headroom}, {"", "", 0}} {
		if c.env != "" {
			t.Setenv(c.env, c.val)
		}
		if g := tuneGC(c.headroom); g != nil {
			g.stop()
			t.Errorf("%s=%q, headroom %d: tuneGC changed the collector's settings", c.env, c.val, c.headroom)
		}
		if p := gcPercent(); p != percent {
			t.Errorf("%s=%q, headroom %d: GC percent %d, want %d", c.env, c.val, c.headroom, p, percent)
		}
	}
}
