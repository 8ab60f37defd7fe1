package loader

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/internal/testenv"
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

// quietTracer is a Tracer reading a fake ring through quietPoller (a
// record committed every sleep, nobody woken), polling every poll.
func quietTracer(t *testing.T, sleep, poll time.Duration) *Tracer {
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Close(); wr.Close() })
	f := newFakeRing(512)
	f.r.file = rd
	f.r.conn = &quietPoller{f: f, sleep: sleep}
	return &Tracer{reader: &f.r, opts: Options{PollInterval: poll}}
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
	tr := quietTracer(t, 40*time.Millisecond, 20*time.Millisecond)
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

type niceHandler struct {
	nice, tid int
	cancel    context.CancelFunc
}

func (h *niceHandler) Record(raw []byte) {}
func (h *niceHandler) Tick() {
	if h.tid == 0 {
		h.tid = unix.Gettid()
		raw, _ := unix.Getpriority(unix.PRIO_PROCESS, 0)
		h.nice = 20 - raw
	}
	h.cancel()
}

// The reader's thread runs at readerNice while Run reads (where the kernel
// allows it: root here), and at its nice value before once Run returns
// (the thread goes back to serve other goroutines).
func TestReaderRaised(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs CAP_SYS_NICE: run as root")
	}
	tr := quietTracer(t, 10*time.Millisecond, 5*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := &niceHandler{cancel: cancel}
	if err := tr.Run(ctx, h, func(error) {}); err != nil {
		t.Fatal(err)
	}
	if h.nice != readerNice || !tr.ReaderRaised() {
		t.Errorf("the reader ran at nice %d (raised %v), want %d", h.nice, tr.ReaderRaised(), readerNice)
	}
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, h.tid)
	if err != nil {
		t.Fatal(err)
	}
	if nice := 20 - raw; nice != 0 {
		t.Errorf("the reader's thread left at nice %d after Run, want 0", nice)
	}
}

// A reader without CAP_SYS_NICE (the shipped agent's capabilities) and
// with no RLIMIT_NICE to reach readerNice runs at the job's priority: Run
// goes on, and says so (ReaderRaised). The test binary run again, its
// bounding set without CAP_SYS_NICE. (The other way, raised by a limit
// alone, the systemd unit's LimitNICE=-10, is not tested: no process here
// may raise RLIMIT_NICE.)
func TestReaderNotRaised(t *testing.T) {
	if os.Getenv("CT_TEST_READER_CHILD") != "" {
		restore, raised := raiseReader()
		restore()
		fmt.Printf("raised=%v\n", raised)
		return
	}
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root to drop CAP_SYS_NICE from")
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NICE, &lim); err != nil || lim.Cur >= 20-readerNice {
		t.Skipf("RLIMIT_NICE %d lets any thread here reach nice %d (%v)", lim.Cur, readerNice, err)
	}
	cmd := exec.Command(testenv.LookPath(t, "setpriv"), "--bounding-set", "-sys_nice", "--inh-caps", "-all", "--",
		os.Args[0], "-test.run", "^TestReaderNotRaised$")
	cmd.Env = append(os.Environ(), "CT_TEST_READER_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("setpriv: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "raised=false\n") {
		t.Errorf("without CAP_SYS_NICE: %q, want raised=false", out)
	}
}
