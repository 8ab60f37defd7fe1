package record

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// recordGCPercent is the garbage collector's target while recording with
// Options.GCHeadroom: a collection each time the heap has grown by four
// times what was live after the last, where Go's default (100) collects
// each time it has doubled. The reader allocates a little at each event
// (an allocation's ledger entry), and its collections were some 8% of its
// CPU (docs/benchmarks.md, issue 41).
const recordGCPercent = 400

// gcTuner holds the collector at recordGCPercent while a recording runs,
// within a memory limit that it moves, once a second, to what Go's default
// target would let the process use plus the headroom: the higher percent
// costs at most that much memory more than the default, and, the limit
// never below the default's target plus the headroom, the collector runs no
// more often than it would by default (unless the live heap more than
// doubles within a second, until the next move).
type gcTuner struct {
	headroom  uint64
	percent   int   // as it was: restored by stop
	limit     int64 // as it was: restored by stop
	samples   []metrics.Sample
	last      time.Time // the last update
	lastLimit int64     // the limit set last
}

// gcEvery is how often the limit follows the live heap.
const gcEvery = time.Second

// tick updates the limit when gcEvery has passed since the last update.
func (g *gcTuner) tick() {
	if g != nil && time.Since(g.last) >= gcEvery {
		g.last = time.Now()
		g.update()
	}
}

// The runtime's figures the limit is worked out from: the heap live after
// the last collection, all the memory the runtime holds, and its heap's
// part of that.
var gcMetrics = [...]string{
	"/gc/heap/live:bytes",
	"/memory/classes/total:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/memory/classes/heap/released:bytes",
}

// tuneGC holds the collector at recordGCPercent, at most headroom bytes
// over the default's target, until stop; nil (nothing changed) when
// headroom is 0 or the user chose the collector's settings (GOGC,
// GOMEMLIMIT).
func tuneGC(headroom uint64) *gcTuner {
	if headroom == 0 || os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return nil
	}
	g := &gcTuner{headroom: headroom, samples: make([]metrics.Sample, len(gcMetrics))}
	g.last = time.Now()
	for i, name := range gcMetrics {
		g.samples[i].Name = name
	}
	g.limit = debug.SetMemoryLimit(-1) // a negative limit reads it
	g.update()
	g.percent = debug.SetGCPercent(recordGCPercent)
	return g
}

// update moves the limit to the default target's memory (twice the live
// heap, and what the runtime holds beside its heap) plus the headroom.
func (g *gcTuner) update() {
	if g == nil {
		return
	}
	metrics.Read(g.samples)
	var v [6]uint64
	for i, s := range g.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	live, total := v[0], v[1]
	heap := v[2] + v[3] + v[4] + v[5]
	other := total - min(heap, total)
	limit := 2*live + other + g.headroom
	g.lastLimit = int64(min(limit, uint64(g.limit))) // never above one the process had
	debug.SetMemoryLimit(g.lastLimit)
}

// stop gives the collector back its settings from before tuneGC.
func (g *gcTuner) stop() {
	if g == nil {
		return
	}
	debug.SetGCPercent(g.percent)
	debug.SetMemoryLimit(g.limit)
}
