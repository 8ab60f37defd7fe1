package agent

// ui.go: the memory page served live (/ui): export's page, its data taken
// from each process's live set and the flight recorder's latest events,
// copied on the reader goroutine and built off it.

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/cudatrace/cudatrace/export"
	"github.com/cudatrace/cudatrace/internal/units"
	"github.com/cudatrace/cudatrace/record"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/tracefile"
)

// PageOptions say how to write the page.
type PageOptions struct {
	// Data: the page's data alone (JSON), what the page fetches to
	// refresh; else the page (HTML).
	Data bool
	// RefreshURL and RefreshSeconds: where and how often the page fetches
	// its data again; "" never.
	RefreshURL     string
	RefreshSeconds int
}

// Page writes the memory page of process pid (0: every process the agent
// holds): memory over the flight recorder's history, the live set now and
// at any moment of it as a flame graph, the history's failures, and the
// processes' accounts.
func (a *Agent) Page(ctx context.Context, w io.Writer, pid uint32, opts PageOptions) error {
	var (
		lp  *export.LivePage
		err error
	)
	if rerr := a.do(ctx, func() { lp, err = a.livePage(pid) }); rerr != nil {
		return rerr
	}
	if err != nil {
		return err
	}
	lp.RefreshURL, lp.RefreshSeconds = opts.RefreshURL, opts.RefreshSeconds
	page := lp.Build()
	if opts.Data {
		return page.WriteJSON(w)
	}
	return page.WriteHTML(w)
}

// livePage copies what the page of pid needs (on the reader goroutine).
func (a *Agent) livePage(pid uint32) (*export.LivePage, error) {
	pids := a.pids()
	if pid != 0 {
		if a.ledger.Process(pid) == nil {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		pids = []uint32{pid}
	}
	src := a.stacksFor()
	host, _ := os.Hostname()
	lp := &export.LivePage{Now: record.BootNow(), Wall: a.wall, Stacks: src,
		Title: "cudatrace agent on " + host, Source: "the cudatrace agent on " + host}
	var short []string
	for _, pid := range pids {
		p, ps := a.ledger.Process(pid), a.procs[pid]
		if p == nil || ps == nil {
			continue
		}
		segs, tensors := p.AtEnd() // an ended process's: what it held at exit
		live := slices.Concat(segs, tensors)
		history := a.hist.list(pid)
		acc := report.NewProcess(p, a.wall)
		if c := a.model.Get(pid); c != nil && c.First != nil {
			acc.Cmdline, acc.Container, acc.PodUID = c.First.Cmdline, c.First.Container, c.First.Pod
		}
		for _, al := range live {
			src.add(a, al.Stack)
		}
		src.addHistory(a, history)
		lp.Processes = append(lp.Processes, export.LiveProcess{Account: acc, Live: live, History: history,
			Exited: p.Exited, ExitTime: p.ExitTime})
		if len(history) > 0 && (p.Allocs+p.Frees+p.Failed+p.TensorAllocs+p.TensorFrees) > uint64(len(history)) {
			short = append(short, fmt.Sprintf("%d from %s", pid, a.wall(history[0].End).Format(time.TimeOnly)))
		}
	}
	if pid != 0 && len(lp.Processes) == 1 {
		lp.Title += fmt.Sprintf(": pid %d (%s)", pid, lp.Processes[0].Account.Comm)
	}
	procs := "1 process"
	if len(lp.Processes) != 1 {
		procs = fmt.Sprintf("%d processes", len(lp.Processes))
	}
	lp.Header = fmt.Sprintf("Live from the cudatrace agent on %s, running since %s: %s held, %d events read, %d lost",
		host, a.start.Format("2006-01-02 15:04:05 MST"), procs, a.res.Events, a.res.Lost)
	if a.res.Lost > 0 {
		lp.Notes = append(lp.Notes, fmt.Sprintf("WARNING: %d EVENTS WERE LOST since the agent started: every figure may be off", a.res.Lost))
	}
	lp.Notes = append(lp.Notes, fmt.Sprintf("Memory over time is each process's latest events, the flight recorder's (--history-events %d, --history-budget %s); what a process held when its history began is shown live from then, as made before it",
		a.hist.perProc, units.Bytes(uint64(a.hist.max*historyItemCost))))
	if len(short) > 0 {
		lp.Notes = append(lp.Notes, "Histories that begin after their process did (older events dropped): pid "+strings.Join(short, ", pid "))
	}
	if a.res.NVML != nil {
		devs, procs := record.NVMLFrame(*a.res.NVML)
		lp.NVML = &tracefile.NVML{Time: a.res.NVMLTime, Devices: devs, Processes: procs}
	} else if a.res.NVMLError != "" {
		lp.Notes = append(lp.Notes, "The driver's view (NVML): "+a.res.NVMLError)
	}
	return lp, nil
}
