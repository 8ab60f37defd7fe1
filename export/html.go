package export

// html.go: `export --format html`, one self-contained page (htmlpage/:
// its script and style, embedded) that shows where the memory went, from
// a trace of any length; the agent serves the same page live (/ui, its
// data from PageFromHistory). What the page holds and how finely is
// html_build.go's; its data's shape, html_data.go's.

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/replay"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The page's parts: the document, its style and its script (no library,
// nothing fetched).
var (
	//go:embed htmlpage/page.html
	pageHTML string
	//go:embed htmlpage/page.css
	pageCSS string
	//go:embed htmlpage/page.js
	pageJS string
)

// Page is a page's data, ready to write as the page or as its data alone
// (what a live page fetches to refresh).
type Page struct{ d *pageData }

// WriteHTML writes the page: one file, its data, style and script inline.
func (p *Page) WriteHTML(w io.Writer) error {
	head, rest, ok := strings.Cut(pageHTML, "{{style}}")
	mid, tail, ok2 := strings.Cut(rest, "{{data}}")
	mid2, end, ok3 := strings.Cut(tail, "{{script}}")
	if !ok || !ok2 || !ok3 {
		return fmt.Errorf("html: the page template lacks a placeholder")
	}
	title := htmlEscaper.Replace(p.d.Title)
	for _, s := range []string{strings.ReplaceAll(head, "{{title}}", title), pageCSS, mid} {
		if _, err := io.WriteString(w, s); err != nil {
			return fmt.Errorf("html: write: %w", err)
		}
	}
	if err := p.WriteJSON(w); err != nil {
		return err
	}
	for _, s := range []string{mid2, pageJS, end} {
		if _, err := io.WriteString(w, s); err != nil {
			return fmt.Errorf("html: write: %w", err)
		}
	}
	return nil
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")

// WriteJSON writes the page's data. It is safe inside a script element:
// json.Encoder escapes <, > and & in strings.
func (p *Page) WriteJSON(w io.Writer) error {
	if err := json.NewEncoder(w).Encode(p.d); err != nil {
		return fmt.Errorf("html: write data: %w", err)
	}
	return nil
}

// WriteHTML writes the trace at path as one HTML page: memory over time
// per device, by owner or by call path, with the driver's figure beside
// it; the live set at any moment as a flame graph (the peak's by
// default); what a range of time allocated and left live, and added and
// removed per line and function; failures with what was live; the
// report's processes, owners and notes. Two replays of the trace (and
// the report's two, alongside) keep memory bounded by the live set and
// the distinct stacks; the page by what it draws (html_build.go).
func WriteHTML(w io.Writer, path string, opts Options) error {
	type loaded struct {
		rep *report.Report
		err error
	}
	repDone := make(chan loaded, 1)
	go func() {
		rep, err := report.Load(path, report.Options{NoSymbolize: opts.NoSymbolize, PIDs: opts.PIDs, Top: opts.Top})
		repDone <- loaded{rep, err}
	}()
	d, err := htmlFromTrace(path, &opts)
	got := <-repDone
	if err != nil {
		return err
	}
	if got.err != nil {
		return got.err
	}
	rep := got.rep
	var hdr bytes.Buffer
	if err := rep.WriteHeader(&hdr); err != nil {
		return err
	}
	head, notes, _ := strings.Cut(strings.TrimRight(hdr.String(), "\n"), "\n")
	d.Header = head
	if notes != "" {
		d.Notes = append(strings.Split(notes, "\n"), d.Notes...)
	}
	d.Processes, d.Owners, d.NVMLSum = rep.Processes, rep.Owners, rep.NVML
	d.Notes = append(d.Notes, unknownDeviceNote(d.Processes)...)
	if host := hostMemoryNote(d.Processes); host != "" {
		d.Notes = append(d.Notes, host)
	}
	d.Title = "cudatrace: " + filepath.Base(path)
	if len(rep.Trace.Command) > 0 {
		d.Title += " (" + strings.Join(rep.Trace.Command, " ") + ")"
	}
	d.Source = path
	return (&Page{d}).WriteHTML(w)
}

// htmlFromTrace builds the page's data from two replays of the trace.
func htmlFromTrace(path string, opts *Options) (*pageData, error) {
	r, err := tracefile.Open(path)
	if err != nil {
		return nil, err
	}
	meta := r.Meta()
	r.Close()
	b := newPageBuilder(meta.StartBoot)
	// One step and its change, reused: a step is read at once, never
	// kept, and an event's change would otherwise move to the heap.
	var step pageStep
	var change ledger.Change
	each := func(f func(*pageStep)) func(*events.Event, ledger.Change) error {
		return func(ev *events.Event, ch ledger.Change) error {
			if ch.Process == nil || !opts.selected(ch.Process.PID) {
				return nil
			}
			change = ch
			step = pageStep{t: ev.End(), pid: ch.Process.PID, ch: &change, api: ev.API, result: ev.Result, size: ev.Size,
				device: ev.Device, tid: ev.TID}
			if ch.Alloc == nil && ch.Freed == nil && !step.failed() {
				return nil // no memory changed hands
			}
			step.before = ch.Alloc != nil && ch.Alloc.Before
			f(&step)
			return nil
		}
	}
	t, err := replay.Read(path, replay.Options{OnEvent: each(b.scan)})
	if err != nil {
		return nil, err
	}
	if err := opts.checkReplay(t, 0); err != nil {
		return nil, err
	}
	syms := t.Symbols(!opts.NoSymbolize)
	defer syms.Close()
	b.plan(func(st *ledger.Stack) string {
		return owner.OfStack(t.Procs.CaptureOf(st), t.Procs.Python(st.PID), st.Frames).Name
	})
	first := map[*ledger.Stack]*ledger.Stack{}
	b.canon = func(st *ledger.Stack) *ledger.Stack {
		c, ok := first[st]
		if !ok {
			c = t.Ledger.StackOf(st.PID, st.Frames, st.Tensor)
			first[st] = c
		}
		return c
	}
	_, err = replay.Read(path, replay.Options{OnEvent: each(b.build),
		OnNVML: func(n *tracefile.NVML, l *ledger.Ledger) error {
			b.nvmlSample(n, func(pid uint32) (uint64, bool) {
				p := l.Process(pid)
				if p == nil || !opts.selected(pid) || p.Exited && p.ExitTime <= n.Time {
					return 0, false // the driver lists an ended process a while
				}
				return p.Live, true
			})
			return nil
		}})
	if err != nil {
		return nil, err
	}
	b.finish()
	d := b.data(replayStacks{t, syms})
	if !meta.StartWall.IsZero() {
		d.StartWall = meta.WallTime(b.start).Format(time.RFC3339Nano)
	}
	opts.warnGone(syms)
	return d, nil
}

// hostMemoryNote says that pinned host memory, which the page leaves out,
// was used, and how much at most.
func hostMemoryNote(procs []report.Process) string {
	var peak uint64
	for _, p := range procs {
		peak += p.HostPeakBytes
	}
	if peak == 0 {
		return ""
	}
	return fmt.Sprintf("Pinned host memory (cudaHostAlloc and the like, up to %s summed over the processes' peaks) is not drawn here: it is not GPU memory (the processes table has it)",
		units.Bytes(peak))
}
