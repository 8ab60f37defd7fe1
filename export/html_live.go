package export

// html_live.go: the page of a live ledger (the agent's /ui): its data
// comes from each process's live set now and its latest events, the
// flight recorder's, rather than from a trace replayed. What a process
// held when its history began (the live set, with the history's own
// allocations taken out and its frees put back) is shown live from then,
// marked as made before, as a trace's FlagBefore allocations are.

import (
	"cmp"
	"slices"
	"time"

	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/owner"
	"github.com/cudatrace/cudatrace/report"
	"github.com/cudatrace/cudatrace/tracefile"
)

// LivePage is what a live page shows.
type LivePage struct {
	Title, Source string
	Header        string
	Notes         []string
	Processes     []LiveProcess
	// Stacks names the stacks of the processes' allocations and history.
	Stacks Stacks
	// Now is the page's end (boot ns); Wall converts boot ns to wall time.
	Now  uint64
	Wall func(boot uint64) time.Time
	// NVML is the driver's latest sample; nil without one.
	NVML *tracefile.NVML
	// RefreshURL, when set, is where the page fetches its data again
	// every RefreshSeconds.
	RefreshURL     string
	RefreshSeconds int
}

// LiveProcess is one process of a live page.
type LiveProcess struct {
	Account report.Process
	// Live is what it holds now, segments and tensors (an ended
	// process's: what it held when it ended).
	Live []*ledger.Allocation
	// History is its latest events, oldest first (HistoryItem).
	History []HistoryItem
	// Exited: it ended, at ExitTime (boot ns), releasing Live.
	Exited   bool
	ExitTime uint64
}

// Build makes the page.
func (lp *LivePage) Build() *Page {
	steps := lp.steps()
	start := lp.Now
	if len(steps) > 0 {
		start = min(start, steps[0].t)
	}
	b := newPageBuilder(start)
	for i := range steps {
		b.scan(&steps[i])
	}
	// Where nothing happened since the history began, the page still
	// ends now.
	b.last = max(b.last, lp.Now, b.start)
	b.plan(func(st *ledger.Stack) string {
		return owner.OfMapped(lp.Stacks.Maps(st), lp.Stacks.Frames(st)).Name
	})
	for i := range steps {
		b.build(&steps[i])
	}
	if lp.NVML != nil {
		live := map[uint32]bool{}
		for _, p := range lp.Processes {
			live[p.Account.PID] = !p.Exited
		}
		b.nvmlSample(lp.NVML, func(pid uint32) (uint64, bool) {
			if !live[pid] {
				return 0, false
			}
			return b.seriesTotal(serKey{pid, allDevices, levelGPU}), true
		})
	}
	b.finish()
	owners := lp.owners(b)
	d := b.data(lp.Stacks)
	d.Owners = owners
	d.Title, d.Source, d.Header = lp.Title, lp.Source, lp.Header
	d.Notes = append(slices.Clone(lp.Notes), d.Notes...)
	for _, p := range lp.Processes {
		d.Processes = append(d.Processes, p.Account)
	}
	d.Notes = append(d.Notes, unknownDeviceNote(d.Processes)...)
	if lp.Wall != nil && b.start != 0 {
		d.StartWall = lp.Wall(b.start).Format(time.RFC3339Nano)
	}
	if lp.RefreshURL != "" {
		d.Live = &pageLive{URL: lp.RefreshURL, EverySeconds: lp.RefreshSeconds}
	}
	return &Page{d}
}

// steps are the processes' steps in time order: each one's memory from
// before its history, its history, and its end.
func (lp *LivePage) steps() []pageStep {
	var out []pageStep
	for _, p := range lp.Processes {
		pid := p.Account.PID
		made := map[*ledger.Allocation]bool{}
		var freed []*ledger.Allocation
		for i := range p.History {
			ch := &p.History[i].Change
			if ch.Alloc != nil {
				made[ch.Alloc] = true
			}
			for a := range ch.AllFreed() {
				freed = append(freed, a)
			}
		}
		from := lp.Now
		if len(p.History) > 0 {
			from = p.History[0].End
		}
		seen := map[*ledger.Allocation]bool{}
		for _, a := range slices.Concat(p.Live, freed) {
			if made[a] || seen[a] {
				continue
			}
			seen[a] = true
			out = append(out, pageStep{t: from, pid: pid, ch: &ledger.Change{Alloc: a}, before: true})
		}
		for i := range p.History {
			it := &p.History[i]
			out = append(out, pageStep{t: it.End, pid: pid, ch: &it.Change, api: it.API, result: it.Result,
				size: it.Size, device: it.Device})
		}
		if p.Exited && len(p.Live) > 0 {
			ch := &ledger.Change{Freed: p.Live[0], AlsoFreed: p.Live[1:], Exit: true}
			out = append(out, pageStep{t: max(p.ExitTime, from), pid: pid, ch: ch})
		}
	}
	slices.SortStableFunc(out, func(a, b pageStep) int { return cmp.Compare(a.t, b.t) })
	return out
}

// owners is where each process's GPU memory went, as the exported page
// has it (report's owners): what it holds now, and its live set at the
// peak the page shows (b's, before data renumbers its stacks).
func (lp *LivePage) owners(b *pageBuilder) []report.ProcessOwners {
	of := map[*ledger.Stack]owner.Owner{}
	ownerOf := func(st *ledger.Stack) owner.Owner {
		w, ok := of[st]
		if !ok {
			w = owner.OfMapped(lp.Stacks.Maps(st), lp.Stacks.Frames(st))
			of[st] = w
		}
		return w
	}
	var out []report.ProcessOwners
	for _, p := range lp.Processes {
		pid := p.Account.PID
		var end, peak []report.OwnerLive
		for _, a := range p.Live {
			if levelOf(a) == levelGPU && a.Stack != nil {
				end = append(end, report.OwnerLive{Stack: a.Stack, Device: a.Device, Bytes: a.Size, Count: 1})
			}
		}
		for _, bs := range b.series {
			if bs.pid != pid || bs.dev != allDevices || bs.level != levelGPU || bs.snap < 0 {
				continue
			}
			sn := b.snaps[bs.snap]
			for i, id := range sn.Stack {
				peak = append(peak, report.OwnerLive{Stack: b.stacks[id].st, Device: int32(sn.DevCol[i]),
					Bytes: uint64(sn.Bytes[i]), Count: uint64(sn.Count[i])})
			}
		}
		out = append(out, report.LiveOwners(pid, end, peak, ownerOf))
	}
	return out
}
