package loader

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// quietPoller stands for the network poller over a ring whose records are
// all below the wakeup mark: while the reader waits, BPF commits one and
// wakes nobody, and the wait ends at its deadline.
type quietPoller struct {
	f     *fakeRing
	sleep time.Duration
	n     int
}

func (p *quietPoller) Read(ready func(uintptr) bool) error {
	if ready(0) {
		return nil
	}
	time.Sleep(p.sleep / 2)
	pos := p.f.reserve(payload(p.n, 16))
	p.f.commit(pos, 16)
	p.n++
	time.Sleep(p.sleep / 2)
	return os.ErrDeadlineExceeded
}

type orderHandler struct {
	seq    []string
	cancel context.CancelFunc
}

func (h *orderHandler) Record(raw []byte) { h.seq = append(h.seq, "record") }
func (h *orderHandler) Tick() {
	h.seq = append(h.seq, "tick")
	if strings.Count(strings.Join(h.seq, " "), "tick") == 3 {
		h.cancel()
	}
}

// A record committed while the reader waited is handed over before the
// Tick that ends the wait: Tick writes the samples taken meanwhile (NVML),
// and in the trace they must come after the records made before them.
func TestRunRecordsBeforeTick(t *testing.T) {
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	defer wr.Close()
	f := newFakeRing(512)
	f.r.file = rd
	f.r.conn = &quietPoller{f: f, sleep: 40 * time.Millisecond}
	tr := &Tracer{reader: &f.r, opts: Options{PollInterval: 20 * time.Millisecond}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &orderHandler{cancel: cancel}
	if err := tr.Run(ctx, h, func(err error) { t.Errorf("wait: %v", err) }); err != nil {
		t.Fatal(err)
	}
	// The last tick is Run's own after the stop.
	if got, want := strings.Join(h.seq, " "), "record tick record tick record tick tick"; got != want {
		t.Errorf("handed over %q\nwant         %q", got, want)
	}
}
