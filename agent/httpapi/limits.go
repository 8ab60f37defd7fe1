package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// One local client must not push the agent over: every request that makes
// the reader goroutine copy a live set (a profile, a snapshot) or holds a
// stream of records (a trace window) takes a slot. Trace windows past
// their cap are refused at once (429): they last seconds to minutes.
// Profiles and snapshots past theirs wait in line, a bounded line, for at
// most heavyWait; past the line, or the wait, 429. So the reader spends at
// most MaxHeavy copies per tick on requests, and the agent's memory is
// bounded by MaxTraceWindows windows of agent.TraceWindowBytes
// (docs/agent.md, Limits).

// Defaults.
const (
	DefaultMaxTraceWindows = 8
	DefaultMaxHeavy        = 2
	DefaultMaxWaiting      = 32
	// metricsInFlight bounds concurrent /metrics scrapes (503 past it, as
	// promhttp answers).
	metricsInFlight = 4
	// heavyWait is how long a profile or snapshot waits for a slot.
	heavyWait = 30 * time.Second
)

// limiter hands out slots, with a bounded line of waiters.
type limiter struct {
	what       string
	slots      chan struct{}
	waiting    atomic.Int32
	maxWaiting int32
	wait       time.Duration // 0: no waiting
}

func newLimiter(what string, slots, maxWaiting int, wait time.Duration) *limiter {
	return &limiter{what: what, slots: make(chan struct{}, slots), maxWaiting: int32(maxWaiting), wait: wait}
}

// acquire takes a slot, or answers 429 (or the context's end) and returns
// false. release gives the slot back.
func (l *limiter) acquire(w http.ResponseWriter, r *http.Request) bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	if l.wait <= 0 || l.waiting.Add(1) > l.maxWaiting {
		if l.wait > 0 {
			l.waiting.Add(-1)
		}
		l.busy(w)
		return false
	}
	defer l.waiting.Add(-1)
	ctx, cancel := context.WithTimeout(r.Context(), l.wait)
	defer cancel()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		if r.Context().Err() == nil {
			l.busy(w)
		}
		return false
	}
}

func (l *limiter) release() { <-l.slots }

func (l *limiter) busy(w http.ResponseWriter) {
	w.Header().Set("Retry-After", strconv.Itoa(5))
	http.Error(w, fmt.Sprintf("cudatrace agent: %d %s already under way, the most it serves at once: try again later",
		cap(l.slots), l.what), http.StatusTooManyRequests)
}
