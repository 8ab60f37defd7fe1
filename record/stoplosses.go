package record

import (
	"sync"
	"sync/atomic"

	"github.com/cudatrace/cudatrace/loader"
)

// stopMark splits the BPF side's losses at the moment the stop began (the
// context was cancelled, the command exited, --duration passed). Losses
// counted after it are the stop's own: probes still firing while they are
// removed, with the reader no longer reading, and calls whose entry or
// return probe was already gone. They say nothing of the figures while
// tracing, and the agent's cudatrace_lost_events_total (losses while
// serving) never counts them.
type stopMark struct {
	read     func() (map[string]uint64, error)
	once     sync.Once
	done     atomic.Bool
	counters map[string]uint64 // as the stop began; nil if they could not be read
}

// mark reads the counters once; a second call waits for the first. It is
// safe from any goroutine (context.AfterFunc calls it on its own).
func (m *stopMark) mark() {
	m.once.Do(func() {
		c, err := m.read()
		if err == nil {
			m.counters = c
		}
		m.done.Store(true)
	})
}

// stopping is how many of the losses in c came after the stop began: 0
// before it, or when the counters at the stop could not be read (then
// every loss counts as one while tracing, the cautious side).
func (m *stopMark) stopping(c map[string]uint64) uint64 {
	if !m.done.Load() || m.counters == nil {
		return 0
	}
	total, before := loader.Lost(c), loader.Lost(m.counters)
	return total - min(total, before)
}
