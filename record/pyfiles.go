package record

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/pystack"
)

// pyFileSet owns the interpreter files whose layout BPF has (bpf/notify.h
// py_files): a process that maps one gets its layout in BPF from its
// loader's list (py_learn), before its first allocation and whatever the
// reader is doing. It is made with the tracer, before any probe attaches,
// so that the interpreters installed here are known before the first
// process they run can allocate (learnSystem); safe on any goroutine. A
// nil set, or one without a tracer, learns nothing.
type pyFileSet struct {
	tr *loader.Tracer
	mu sync.Mutex
	// known are the files learned, each with a path of the host's that
	// names it ("" for one of a container's, named through a process's
	// root), which sweep checks.
	known map[fileID]string
	// retired are the files forgotten in BPF whose code_dealloc probe
	// waits for no process to map them (sweep), each with the epoch it
	// was forgotten at; marked, for each file with a probe, the epoch at
	// which a layout was last marked as counted by it (countFrees).
	retired, marked map[proc.FileID]uint64
	// epoch counts sweep's passes over every process's mappings, one at
	// a time (scanning), answered on scanned.
	epoch    uint64
	scanning bool
	scanned  chan fileScan
	// later are the code_dealloc probes being put in after their files
	// were learned (countLater) or ended (sweep), and sweep's passes:
	// over before the tracer closes.
	later sync.WaitGroup
}

// learn tells BPF the layout of interpreter in's file (device dev, as
// /proc/PID/maps writes it, and inode; at path from here), relative to
// where a process loads it. Once per file. check is a host path of the
// file ("": none), for sweep.
func (p *pyFileSet) learn(dev string, inode uint64, path string, in *pystack.Interp, check string) error {
	learned, err := p.learnFile(dev, inode, in, check)
	if learned {
		p.countLater(dev, inode, path, in)
	}
	return err
}

// learnFile is learn without the code_dealloc probe (countLater puts it
// in); learned says whether the file was new.
func (p *pyFileSet) learnFile(dev string, inode uint64, in *pystack.Interp, check string) (learned bool, err error) {
	if p == nil || p.tr == nil {
		return false, nil
	}
	k := fileID{dev, inode}
	p.mu.Lock()
	_, known := p.known[k]
	if p.known == nil {
		p.known = map[fileID]string{}
	}
	p.known[k] = check
	if id, ok := k.id(); ok {
		delete(p.retired, id) // learned again: its probe stays
	}
	p.mu.Unlock()
	if known {
		return false, nil
	}
	o, err := in.BPFFile()
	if err != nil {
		return true, fmt.Errorf("python layout of inode %d: %w", inode, err)
	}
	return true, p.tr.SetPythonFile(dev, inode, &o)
}

// countLater puts the code_dealloc probe in on a goroutine of its own
// (p.later, waited for before the tracer closes), for a file learned
// without it, and tells BPF the file's layout again, marked. A layout
// never waits for its probe: a uprobe's registration waits out an RCU
// grace period (7-15 ms here), and registrations on several files do not
// overlap (80 ms for this machine's six interpreters as tracing starts),
// while a process just started makes its first allocations. A process
// that took the unmarked layout meanwhile reads its frames' identities at
// every record (slower, as exact).
func (p *pyFileSet) countLater(dev string, inode uint64, path string, in *pystack.Interp) {
	id, ok := (&proc.Mapping{Dev: dev, Inode: inode}).ID()
	if _, site := in.CodeFreeSite(); !ok || !site {
		return
	}
	p.later.Go(func() {
		o, err := in.BPFFile()
		if err != nil {
			return
		}
		if !p.countFrees(in, path, id, &o, true) {
			return
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, known := p.known[fileID{dev, inode}]; known { // not swept since
			p.tr.SetPythonFile(dev, inode, &o) //nolint:errcheck // unmarked, its identities read
		}
	})
}

// countFrees marks o, the layout of interpreter in's file (at path from
// here, file id), a CPython 3.10 to 3.13's, as one whose processes' code
// object frees BPF counts (pystack/codefree.go), where ct_code_free is at
// the file's code_dealloc: their records then read their frames' code
// objects' identities only after a free. With wait it puts the probe in
// first (once per file: the loader keeps the answer); without, it marks o
// only if the probe is in already. The mark goes with the layout as it is
// given: BPF's per-CPU copies keep a layout given unmarked. A file that
// cannot be probed keeps o as it is, its identities read at every record.
// It says whether it marked o.
func (p *pyFileSet) countFrees(in *pystack.Interp, path string, id proc.FileID, o *bpf.CudatraceCtPyoffsets, wait bool) bool {
	off, ok := in.CodeFreeSite()
	if !ok || p == nil || p.tr == nil {
		return false
	}
	if wait && p.tr.AttachCodeFree(path, id, off) == nil || !wait && p.tr.CodeFreeReady(id) {
		if !pystack.CountedFrees(o) {
			return false
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.marked == nil {
			p.marked = map[proc.FileID]uint64{}
		}
		p.marked[id] = p.epoch // the probe stays until a pass started after this (sweep)
		return true
	}
	return false
}

// learnFiles tells BPF the layout of each of files that is an
// interpreter. One it cannot is left to the reader, which finds it in the
// processes that run it.
func (p *pyFileSet) learnFiles(files []string) {
	if p == nil || p.tr == nil {
		return
	}
	p.learnFound(findInterps(files))
}

// foundInterp is an interpreter file (findInterps): its layout, and the
// file as it was stat'ed.
type foundInterp struct {
	path string
	in   *pystack.Interp
	dev  string
	ino  uint64
}

// findInterps reads which of files are interpreters, and their layouts:
// no BPF, so it may run before the tracer is loaded.
func findInterps(files []string) []foundInterp {
	var found []foundInterp
	for _, f := range files {
		in, err := pystack.DetectFile(f)
		if in == nil || err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(f, &st) == nil {
			found = append(found, foundInterp{path: f, in: in, dev: devName(st.Dev), ino: st.Ino})
		}
	}
	return found
}

// learnFound tells BPF the layouts findInterps found.
func (p *pyFileSet) learnFound(found []foundInterp) {
	if p == nil || p.tr == nil {
		return
	}
	for _, f := range found {
		check := f.path
		if strings.HasPrefix(f.path, proc.Root+"/") {
			check = "" // through a process's root: gone with it, not with the file
		}
		p.learn(f.dev, f.ino, f.path, f.in, check) //nolint:errcheck // see above
	}
}

// devName writes a device number as /proc/PID/maps does (major:minor, hex).
func devName(dev uint64) string {
	return fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
}

// sweep forgets the files learned that may be gone, in BPF too, and ends
// their code_dealloc probes once no process maps them. Run from the
// reader's goroutine, every sweepBPFEvery; what needs every process's
// mappings read (proc.FilesMapped: a node's thousands of mappings) is
// read on a goroutine of its own, and its answer taken at a later sweep.
//
//   - A host file whose path no longer names it (removed: a virtual
//     environment deleted, a package upgraded) is forgotten in BPF at
//     once: its inode may be given to another file, which must not get
//     its layout.
//   - One of a container's, learned through a process's root, has no
//     path that outlives the container: it is forgotten in BPF once no
//     process maps it (its inode may be reused as well, and py_files
//     would fill with the interpreters of every container the node ran).
//   - Either's probe stays while a process maps it, since that process's
//     layout may be marked as one whose frees are counted (countFrees):
//     it goes once a pass over every process's mappings, started after
//     the file was forgotten in BPF (no process can take its layout from
//     py_files after) and after the last layout marked for it, finds no
//     mapping of it. A file learned again before is no longer retired.
//     A probe holds the file's inode: a deleted file's blocks stay taken
//     while it is in.
func (p *pyFileSet) sweep() {
	if p == nil || p.tr == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.scanning {
		select {
		case r := <-p.scanned:
			p.scanning = false
			p.settle(r)
		default:
			return // the last pass is still under way
		}
	}
	asked := map[proc.FileID]fileID{}
	for k, path := range p.known {
		id, ok := k.id()
		if path == "" {
			if ok {
				asked[id] = k
			}
			continue
		}
		var st unix.Stat_t
		if unix.Stat(path, &st) == nil && devName(st.Dev) == k.dev && st.Ino == k.inode {
			continue
		}
		p.tr.ForgetPythonFile(k.dev, k.inode)
		delete(p.known, k)
		if ok {
			p.retire(id)
		}
	}
	for id := range p.retired {
		asked[id] = fileID{}
	}
	if len(asked) == 0 {
		return
	}
	p.epoch++
	r := fileScan{epoch: p.epoch, asked: asked}
	if p.scanned == nil {
		p.scanned = make(chan fileScan, 1)
	}
	p.scanning = true
	p.later.Go(func() {
		p.scanned <- p.scan(r)
	})
}

// fileScan is one pass over every process's mappings for the files sweep
// may forget (asked: a container's by its key in known; a retired one's
// key is not needed), the epoch-th pass started. failed: /proc could not
// be read; counted: a process whose mappings could not be read has a
// layout marked as counted by some file's probe (which one, it cannot
// tell).
type fileScan struct {
	epoch           uint64
	asked           map[proc.FileID]fileID
	mapped          map[proc.FileID]bool
	failed, counted bool
}

// scan makes pass r, off the reader's goroutine. A process whose
// mappings it cannot read (another namespace's, one the tracer has no
// right to) and whose layout in BPF is unmarked, or absent, counts on no
// probe, whatever it maps.
func (p *pyFileSet) scan(r fileScan) fileScan {
	want := make(map[proc.FileID]bool, len(r.asked))
	for id := range r.asked {
		want[id] = true
	}
	mapped, unread, err := proc.FilesMapped(want)
	r.mapped, r.failed = mapped, err != nil
	for _, pid := range unread {
		if o, ok := p.tr.PythonProcess(uint32(pid)); ok && o.InterpCodeGen == pystack.GenFrees {
			r.counted = true
		}
	}
	return r
}

// settle takes pass r's answer (sweep); p.mu is held.
func (p *pyFileSet) settle(r fileScan) {
	if r.failed {
		return
	}
	for id, k := range r.asked {
		if r.mapped[id] {
			continue
		}
		if gone, ok := p.retired[id]; ok {
			if gone < r.epoch && p.marked[id] < r.epoch && !r.counted {
				delete(p.retired, id)
				delete(p.marked, id)
				p.later.Go(p.tr.ForgetCodeFree(id))
			}
			continue
		}
		if path, ok := p.known[k]; ok && path == "" {
			p.tr.ForgetPythonFile(k.dev, k.inode)
			delete(p.known, k)
			p.retire(id)
		}
	}
}

// retire notes that file id was forgotten in BPF now (before the next
// pass starts); p.mu is held.
func (p *pyFileSet) retire(id proc.FileID) {
	if p.retired == nil {
		p.retired = map[proc.FileID]uint64{}
	}
	p.retired[id] = p.epoch
}

// findSystem reads the interpreters installed on the host
// (pystack.SystemInterpreters; 13-27 ms for the 16 files on the machine
// this was written on) on a goroutine of its own, started before the
// tracer loads: the verifier keeps one CPU busy for half a second then,
// and the other is free. None with noFrames.
func findSystem(noFrames bool) <-chan []foundInterp {
	ch := make(chan []foundInterp, 1)
	if noFrames {
		ch <- nil
		return ch
	}
	go func() { ch <- findInterps(pystack.SystemInterpreters()) }()
	return ch
}

// learnSystem tells BPF, on a goroutine of its own, the layouts of the
// host's interpreters findSystem found: started as the probes attach, it
// is over before Run says they are (learnWait), and any process that runs
// one of them gets its Python frames from its first allocation, however
// busy the reader is then. done is closed when it is over.
func (p *pyFileSet) learnSystem(found <-chan []foundInterp) (done chan struct{}) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		p.learnFound(<-found)
	}()
	return done
}

// learnWait bounds how long Run waits for learnSystem before it says the
// probes are attached: a slow file system delays a process's first
// Python frames (absent, counted), never tracing.
const learnWait = 2 * time.Second

// fileID names a file by device (major:minor, hex, as /proc/PID/maps
// writes it) and inode.
type fileID struct {
	dev   string
	inode uint64
}

// id is the file as proc names it; ok is false where dev does not parse.
func (k fileID) id() (proc.FileID, bool) {
	return (&proc.Mapping{Dev: k.dev, Inode: k.inode}).ID()
}
