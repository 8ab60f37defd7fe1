package record

import (
	"sync"

	"github.com/cudatrace/cudatrace/proc"
)

// probedFiles owns the files the reader probed for processes after
// tracing began: the CUDA libraries a process mapped (attachLib) and the
// dynamic loaders of processes' roots (attachLoader), each probed while
// some process maps it. Without an end, a node's every container image's
// loader and CUDA libraries stayed probed for the tracer's life, each
// holding its inode (a deleted image's blocks), a descriptor and the
// kernel's uprobes. The files probed as tracing starts (the host's, found
// before any process maps them) are not here: they stay.
//
// A file goes once a pass over every process's mappings (proc.FilesMapped,
// on a goroutine of its own; its answer taken at the next sweep), started
// after the reader last saw a process map it (saw, at each note and
// capture that shows it, and at its attach), finds no mapping of it: its
// probes end (loader ForgetLibrary, ForgetLoader; closed off the reader's
// goroutine) and the tracer forgets it, so that a process that maps it
// later has it probed anew, as any file new to the tracer. A process that
// mapped it after the pass read its mappings was seen doing so by the
// reader before the answer was taken (its loader's note, or the scan), or
// has it probed anew after. A process whose mappings the pass could not
// read, and which the session follows, keeps every file. Reader's
// goroutine only, but for the passes.
type probedFiles struct {
	files   map[proc.FileID]*probedFile
	epoch   uint64 // passes started
	running bool
	answer  chan probedPass
}

type probedFile struct {
	loader bool   // a dynamic loader (ct_dl_notify), else a CUDA library
	seen   uint64 // the epoch when a process was last seen mapping it
}

// probedPass is one pass's answer.
type probedPass struct {
	epoch  uint64
	asked  []proc.FileID
	mapped map[proc.FileID]bool
	unread []int
	failed bool
}

// add notes file id, probed now for a process that maps it; loader: a
// dynamic loader.
func (p *probedFiles) add(id proc.FileID, loader bool) {
	if p.files == nil {
		p.files = map[proc.FileID]*probedFile{}
	}
	p.files[id] = &probedFile{loader: loader, seen: p.epoch}
}

// saw notes that a process maps file id now (one not here: ignored).
func (p *probedFiles) saw(id proc.FileID) {
	if f := p.files[id]; f != nil {
		f.seen = p.epoch
	}
}

// has says whether file id is here.
func (p *probedFiles) has(id proc.FileID) bool { return p.files[id] != nil }

// sweep takes the last pass's answer, if it is in, and ends what it found
// unmapped (forget); then starts the next pass, one at a time. known says
// whether the session follows a process. It says whether some CUDA
// library was forgotten.
func (p *probedFiles) sweep(forget func(id proc.FileID, loader bool), known func(pid int) bool, bg *sync.WaitGroup) (libs bool) {
	if p.running {
		select {
		case r := <-p.answer:
			p.running = false
			libs = p.settle(r, forget, known)
		default:
			return false
		}
	}
	if len(p.files) == 0 {
		return libs
	}
	p.epoch++
	r := probedPass{epoch: p.epoch}
	want := make(map[proc.FileID]bool, len(p.files))
	for id := range p.files {
		r.asked = append(r.asked, id)
		want[id] = true
	}
	if p.answer == nil {
		p.answer = make(chan probedPass, 1)
	}
	p.running = true
	bg.Go(func() {
		var err error
		r.mapped, r.unread, err = proc.FilesMapped(want)
		r.failed = err != nil
		p.answer <- r
	})
	return libs
}

// settle ends the files pass r found unmapped and not seen since it
// started.
func (p *probedFiles) settle(r probedPass, forget func(id proc.FileID, loader bool), known func(pid int) bool) (libs bool) {
	if r.failed {
		return false
	}
	for _, pid := range r.unread {
		if known(pid) {
			return false
		}
	}
	for _, id := range r.asked {
		f := p.files[id]
		if f == nil || r.mapped[id] || f.seen >= r.epoch {
			continue
		}
		delete(p.files, id)
		forget(id, f.loader)
		libs = libs || !f.loader
	}
	return libs
}
