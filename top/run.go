package top

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Stop says that tracing ended, and why.
type Stop struct {
	Reason string // record.Result.StopReason
	Err    error  // tracing failed
}

// Options tune Run.
type Options struct {
	Every  time.Duration
	Target string // what is traced, for the header
	// In and Out are the terminal. When both are terminals the view is
	// full-screen and interactive; otherwise Out gets plain lines.
	In, Out *os.File
	// Messages collects the tracer's progress lines while the screen is
	// taken (Run shows the last one).
	Messages    *Messages
	NoSymbolize bool
	NoNVML      bool // NVML is not sampled (--nvml=false)
}

// Interactive reports whether Run will draw a full-screen view.
func (o *Options) Interactive() bool {
	return o.In != nil && o.Out != nil && term.IsTerminal(int(o.In.Fd())) && term.IsTerminal(int(o.Out.Fd()))
}

// Run draws the collector's snapshots until ctx is done, the user quits,
// or tracing stops (stop): plain lines end there; the full-screen view
// says so and waits for q. It returns the error tracing failed with.
func Run(ctx context.Context, c *Collector, opts Options, stop <-chan Stop) error {
	if opts.Interactive() {
		return runScreen(ctx, c, opts, stop)
	}
	return runLines(ctx, c, opts, stop)
}

func runLines(ctx context.Context, c *Collector, opts Options, stop <-chan Stop) error {
	out := io.Writer(os.Stdout)
	if opts.Out != nil {
		out = opts.Out
	}
	printed := 0 // Seq of the last snapshot printed
	print := func() error {
		s := c.Snapshot()
		if s == nil || s.Seq == printed {
			return nil
		}
		printed = s.Seq
		if err := WriteLines(out, s, time.Now()); err != nil {
			return fmt.Errorf("top: %w", err)
		}
		return nil
	}
	for {
		select {
		case <-c.Updated():
			if err := print(); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		case st := <-stop:
			if st.Err != nil {
				return st.Err
			}
			return print() // the last state, flushed when tracing stopped
		}
	}
}

// Terminal control: the alternate screen keeps the user's scrollback, and
// is left, with the cursor shown again, on every way out.
const (
	enterScreen = "\x1b[?1049h\x1b[?25l"
	leaveScreen = "\x1b[?25h\x1b[?1049l"
)

type key int

const (
	keyQuit key = iota
	keyUp
	keyDown
)

func runScreen(ctx context.Context, c *Collector, opts Options, stop <-chan Stop) (err error) {
	in, out := int(opts.In.Fd()), opts.Out
	old, err := term.MakeRaw(in)
	if err != nil {
		return fmt.Errorf("top: terminal: %w", err)
	}
	defer func() {
		io.WriteString(out, leaveScreen)
		if rerr := term.Restore(in, old); rerr != nil && err == nil {
			err = fmt.Errorf("top: restore terminal: %w", rerr)
		}
	}()
	if _, err := io.WriteString(out, enterScreen); err != nil {
		return fmt.Errorf("top: %w", err)
	}
	keys := make(chan key, 16)
	go readKeys(opts.In, keys)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)

	var sym *symbolize.Symbolizer
	if !opts.NoSymbolize {
		sym = symbolize.New()
		defer sym.Close()
	}
	frames := framer(sym)

	var selected uint32
	stopped := ""
	draw := func() {
		s := c.Snapshot()
		w, h, err := term.GetSize(int(out.Fd()))
		if err != nil {
			w, h = 80, 24
		}
		status := stopped
		if status == "" && opts.Messages != nil {
			status = opts.Messages.Last()
		}
		var b strings.Builder
		b.WriteString("\x1b[H")
		if s == nil {
			b.WriteString("cudatrace top: starting" + "\x1b[K\r\n")
			if status != "" {
				b.WriteString(status + "\x1b[K\r\n")
			}
		} else {
			if selected == 0 && len(s.Processes) > 0 {
				selected = s.Processes[0].PID
				c.Select(selected)
			}
			for _, l := range Screen(s, View{Selected: selected, Status: status, Width: w, Height: h,
				Every: opts.Every, Target: opts.Target, NVMLOff: opts.NoNVML}, frames) {
				b.WriteString(l + "\x1b[K\r\n")
			}
		}
		b.WriteString("\x1b[J")
		io.WriteString(out, strings.TrimSuffix(b.String(), "\r\n\x1b[J")+"\x1b[J")
	}
	move := func(d int) {
		s := c.Snapshot()
		if s == nil || len(s.Processes) == 0 {
			return
		}
		i := 0
		for j, p := range s.Processes {
			if p.PID == selected {
				i = j
			}
		}
		i = min(max(i+d, 0), len(s.Processes)-1)
		selected = s.Processes[i].PID
		c.Select(selected)
	}
	draw()
	for {
		select {
		case <-ctx.Done():
			return nil
		case st := <-stop:
			if st.Err != nil {
				return st.Err
			}
			stopped = "tracing stopped"
			if st.Reason != "" {
				stopped += ": " + st.Reason
			}
			stopped += "; q to quit"
			stop = nil // a nil channel: never again
		case k := <-keys:
			switch k {
			case keyQuit:
				return nil
			case keyUp:
				move(-1)
			case keyDown:
				move(1)
			}
		case <-c.Updated():
		case <-winch:
		}
		draw()
	}
}

// framer returns the screen's Frames: symbolized with sym (nil: addresses
// only), Python frames named, each stack once.
func framer(sym *symbolize.Symbolizer) Frames {
	cache := map[string][]symbolize.Frame{}
	return func(st *Stack) []symbolize.Frame {
		// Per process and capture: addresses mean what its mappings, its
		// files (a container's own) and its Python frames' table say.
		k := fmt.Sprintf("%d %p %v", st.PID, st.Capture, st.Frames)
		if f, ok := cache[k]; ok {
			return f
		}
		f := procmodel.Frames(sym, st.Capture, st.Python, st.Frames)
		cache[k] = f
		return f
	}
}

// readKeys turns the raw terminal's bytes into keys: q or Ctrl-C (raw
// mode delivers it as a byte, not SIGINT), j/k and the arrow keys in both
// their cursor-key forms.
func readKeys(in io.Reader, keys chan<- key) {
	buf := make([]byte, 64)
	for {
		n, err := in.Read(buf)
		if err != nil {
			keys <- keyQuit
			return
		}
		b := buf[:n]
		for len(b) > 0 {
			switch {
			case b[0] == 'q' || b[0] == 'Q' || b[0] == 3:
				keys <- keyQuit
				b = b[1:]
			case b[0] == 'k':
				keys <- keyUp
				b = b[1:]
			case b[0] == 'j':
				keys <- keyDown
				b = b[1:]
			case bytes.HasPrefix(b, []byte("\x1b[A")) || bytes.HasPrefix(b, []byte("\x1bOA")):
				keys <- keyUp
				b = b[3:]
			case bytes.HasPrefix(b, []byte("\x1b[B")) || bytes.HasPrefix(b, []byte("\x1bOB")):
				keys <- keyDown
				b = b[3:]
			default:
				b = b[1:]
			}
		}
	}
}

// Messages is an io.Writer that keeps the tracer's lines for the status
// line while the screen is taken, and all of them for after.
type Messages struct {
	mu    sync.Mutex
	lines []string
	part  string
}

func (m *Messages) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	text := m.part + string(p)
	parts := strings.Split(text, "\n")
	m.part = parts[len(parts)-1]
	for _, l := range parts[:len(parts)-1] {
		if l != "" {
			m.lines = append(m.lines, l)
		}
	}
	return len(p), nil
}

// Last returns the latest complete line.
func (m *Messages) Last() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.lines) == 0 {
		return ""
	}
	return m.lines[len(m.lines)-1]
}

// Lines returns every line so far.
func (m *Messages) Lines() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.lines...)
}
