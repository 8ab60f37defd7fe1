package record

import (
	"context"
	"os"
	"sort"
	"sync"

	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/unwind"
)

// uwTables gives BPF what unwinding a traced process's stacks takes
// (bpf/unwind.h): each executable file's call-frame rules as rows
// (unwind.Compact), made once per file (device and inode) on a goroutine
// of their own when a traced process is first seen mapping it, off the
// event path; and each process's mappings of the files whose rows are
// loaded. Until a file's rows are, a stack through it falls back to the
// window (counted by BPF). A file's rows stay while some living process
// maps it, and their room is given to other files after. It follows
// what the session reads of each process (its captures and its loader's
// notes: update) and its life (forget, from life.end).
type uwTables struct {
	tr   *loader.Tracer
	mu   sync.Mutex
	file map[proc.FileID]*uwFile
	proc map[uint32][]proc.Mapping // each process's executable file mappings
	free []uwSpan                  // uw_rows' room not in use, by start
	work chan uwJob
	done chan struct{}
	// stop ends the making of rows at close: what is queued then is for
	// processes traced no longer (a large library takes ~100 ms).
	ctx  context.Context
	stop context.CancelFunc
	// Stats: files whose rows are loaded, that could not be made (or
	// found no room), rows' room in use (a file's rows and two).
	loaded, failed int
	rows           uint32
}

type uwFile struct {
	ready, failed bool
	c             *unwind.Compact
	index         unwind.RowIndex
	span          uwSpan // its rows' and its index's room
	users         map[uint32]bool
}

type uwSpan struct{ first, n uint32 }

type uwJob struct {
	id  proc.FileID
	pid uint32
	m   proc.Mapping
}

func newUWTables(tr *loader.Tracer) *uwTables {
	u := &uwTables{tr: tr, file: map[proc.FileID]*uwFile{}, proc: map[uint32][]proc.Mapping{},
		free: []uwSpan{{0, tr.UnwindRowCap()}}, work: make(chan uwJob, 1024), done: make(chan struct{})}
	u.ctx, u.stop = context.WithCancel(context.Background())
	go u.run()
	return u
}

// close stops the goroutine that makes rows, leaving what it had not
// made yet: the tracer closes after.
func (u *uwTables) close() {
	if u == nil {
		return
	}
	u.stop()
	close(u.work)
	<-u.done
}

// update takes process pid's mappings as read now: the files new to it
// are made rows for, and its mappings with rows go to BPF.
func (u *uwTables) update(pid uint32, maps []proc.Mapping) {
	if u == nil {
		return
	}
	var exec []proc.Mapping
	for _, m := range maps {
		if m.Exec() && m.File() {
			exec = append(exec, m)
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.drop(pid, exec)
	u.proc[pid] = exec
	for _, m := range exec {
		id, ok := m.ID()
		if !ok {
			continue
		}
		f := u.file[id]
		if f == nil {
			f = &uwFile{users: map[uint32]bool{}}
			u.file[id] = f
			select {
			case u.work <- uwJob{id, pid, m}:
			default:
				f.failed = true // the queue is full: another read of it tries again
				delete(u.file, id)
				continue
			}
		}
		f.users[pid] = true
	}
	u.write(pid)
}

// forget drops process pid: its mappings, and the rows of files no other
// process maps.
func (u *uwTables) forget(pid uint32) {
	if u == nil {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.drop(pid, nil)
	delete(u.proc, pid)
}

// drop takes pid off the users of the files it mapped that keep is
// without, freeing the rows of those left unused; u.mu is held.
func (u *uwTables) drop(pid uint32, keep []proc.Mapping) {
	still := map[proc.FileID]bool{}
	for _, m := range keep {
		if id, ok := m.ID(); ok {
			still[id] = true
		}
	}
	for _, m := range u.proc[pid] {
		id, ok := m.ID()
		if !ok || still[id] {
			continue
		}
		f := u.file[id]
		if f == nil {
			continue
		}
		delete(f.users, pid)
		if len(f.users) == 0 && (f.ready || f.failed) {
			u.release(id, f)
		}
	}
}

// release frees a file's rows; u.mu is held. No process's mappings point
// at them any more.
func (u *uwTables) release(id proc.FileID, f *uwFile) {
	delete(u.file, id)
	if !f.ready {
		u.failed--
		return
	}
	u.loaded--
	u.rows -= f.span.n
	u.free = append(u.free, f.span)
	sort.Slice(u.free, func(i, j int) bool { return u.free[i].first < u.free[j].first })
	merged := u.free[:1]
	for _, s := range u.free[1:] {
		last := &merged[len(merged)-1]
		if last.first+last.n == s.first {
			last.n += s.n
		} else {
			merged = append(merged, s)
		}
	}
	u.free = merged
}

// alloc takes n rows of room (first fit); u.mu is held.
func (u *uwTables) alloc(n uint32) (uwSpan, bool) {
	for i, s := range u.free {
		if s.n >= n {
			u.free[i] = uwSpan{s.first + n, s.n - n}
			if u.free[i].n == 0 {
				u.free = append(u.free[:i], u.free[i+1:]...)
			}
			return uwSpan{s.first, n}, true
		}
	}
	return uwSpan{}, false
}

// write gives BPF process pid's mappings of files whose rows are loaded;
// u.mu is held.
func (u *uwTables) write(pid uint32) {
	var out []loader.UnwindMap
	for _, m := range u.proc[pid] {
		id, _ := m.ID()
		f := u.file[id]
		if f == nil || !f.ready {
			continue
		}
		for _, cm := range f.c.Mappings(m) {
			out = append(out, loader.UnwindMap{Start: cm.Start, End: cm.End, Bias: cm.Bias, First: f.span.first,
				Nrows: uint32(len(f.c.Rows)), Base: f.index.Base, Nbuckets: uint32(len(f.index.Start) - 1), Shift: f.index.Shift})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start < out[j].Start })
	_ = u.tr.SetUnwindMaps(pid, out) // a process gone meanwhile: its entry goes at the sweep
}

// run makes the rows of each file asked for, loads them, and gives them
// to the processes that map it.
func (u *uwTables) run() {
	defer close(u.done)
	for j := range u.work {
		if u.ctx.Err() != nil {
			continue // closing: the queue drained unmade
		}
		rows, c := u.make(j)
		var index unwind.RowIndex
		var buckets []loader.UnwindBucket
		if c != nil {
			index = c.Index()
			buckets = make([]loader.UnwindBucket, len(index.Start)-1)
			for b := range buckets {
				buckets[b] = loader.UnwindBucket{Lo: index.Start[b], Hi: index.Start[b+1]}
			}
		}
		u.mu.Lock()
		f := u.file[j.id]
		if f == nil { // dropped meanwhile
			u.mu.Unlock()
			continue
		}
		span, ok := uwSpan{}, false
		if c != nil {
			span, ok = u.alloc(uint32(unwind.IndexLen(len(rows))))
		}
		if ok && u.tr.WriteUnwindRows(span.first, rows, buckets) != nil {
			u.free = append(u.free, span)
			ok = false
		}
		if !ok {
			f.failed = true
			u.failed++
		} else {
			f.ready, f.c, f.index, f.span = true, c, index, span
			u.loaded++
			u.rows += span.n
		}
		if len(f.users) == 0 {
			u.release(j.id, f)
		} else if ok {
			for pid := range f.users {
				u.write(pid)
			}
		}
		u.mu.Unlock()
	}
}

// make reads the file of job j's mapping (through process j.pid, which
// maps it) into rows; nil where it cannot.
func (u *uwTables) make(j uwJob) ([]loader.UnwindRow, *unwind.Compact) {
	fh, err := proc.OpenMapping(int(j.pid), j.m)
	if err != nil {
		return nil, nil
	}
	c, err := unwind.CompactFile(u.ctx, fh, j.m.Path)
	if err != nil || len(c.Rows) == 0 {
		return nil, nil
	}
	rows := make([]loader.UnwindRow, len(c.Rows))
	for i, r := range c.Rows {
		rows[i] = loader.UnwindRow{Pc: r.PC, Cfa: r.CFA, Fp: r.FP, Ra: r.RA, CfaOff: r.CFAOff, FpOff: r.FPOff, RaOff: r.RAOff}
	}
	return rows, c
}

// unwindCheck (CUDATRACE_TEST_UNWIND_CHECK=1, for tests) has BPF unwind
// and copy the window beside the frames it unwinds, and the session
// unwind the window too and compare (enrich.Stats' BPFSame, BPFDiffer), keeping the
// unwinder's stack: the two must be the same frame for frame.
var unwindCheck = os.Getenv("CUDATRACE_TEST_UNWIND_CHECK") == "1"
