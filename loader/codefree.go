package loader

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cilium/ebpf/link"

	"github.com/cudatrace/cudatrace/proc"
)

// codeFrees owns the probes on CPython interpreters' code_dealloc
// (bpf/python.h ct_code_free), one per interpreter file, which count each
// process's code objects freed for the Python walk (pystack/codefree.go).
// Attached from the reader's goroutine and from those that learn the
// host's interpreters as tracing starts, several at once (each attach
// waits out an RCU grace period, 7-15 ms here): it has a lock of its own,
// not held while a file is attached. A file's probe holds its inode (a
// deleted file's blocks stay taken while it is in): the reader ends it
// once no process maps the file (ForgetCodeFree).
type codeFrees struct {
	mu    sync.Mutex
	files map[proc.FileID]*codeFreeFile
	done  bool // detached: no more
}

// codeFreeFile is one file's attach, made once; err is its answer, links
// the probe (under codeFrees.mu).
type codeFreeFile struct {
	once  sync.Once
	err   error
	done  chan struct{} // closed once err is the answer
	links []link.Link
}

// errDetached: the tracer's probes are gone, and no other is attached.
var errDetached = errors.New("the tracer is detached")

// AttachCodeFree attaches ct_code_free at off, the file offset of
// code_dealloc in the interpreter file at path, which must be file id;
// once per file (until ForgetCodeFree), the first answer kept. Safe on
// any goroutine. The file is opened through proc.Open (only a regular
// file, that one) and probed through that descriptor, as Attach does.
func (t *Tracer) AttachCodeFree(path string, id proc.FileID, off uint64) error {
	c := &t.codeFree
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return errDetached
	}
	f := c.files[id]
	if f == nil {
		if c.files == nil {
			c.files = map[proc.FileID]*codeFreeFile{}
		}
		f = &codeFreeFile{done: make(chan struct{})}
		c.files[id] = f
	}
	c.mu.Unlock()
	f.once.Do(func() {
		f.err = t.attachCodeFree(f, path, id, off)
		close(f.done)
	})
	return f.err
}

// CodeFreeReady says whether ct_code_free is attached to file id, without
// waiting for an attach under way (AttachCodeFree).
func (t *Tracer) CodeFreeReady(id proc.FileID) bool {
	c := &t.codeFree
	c.mu.Lock()
	f := c.files[id]
	c.mu.Unlock()
	if f == nil {
		return false
	}
	select {
	case <-f.done:
		return f.err == nil
	default:
		return false
	}
}

// ForgetCodeFree ends file id's probe: from now on CodeFreeReady says
// false for it, and AttachCodeFree attaches a new one. The probe itself
// goes when end is called: closing a uprobe waits out an RCU grace
// period (28-116 ms here), which end waits out, with any attach under way
// (call it off the reader's goroutine). The caller knows that no process
// whose layout was marked for this probe still runs (a process's code
// object frees would go uncounted).
func (t *Tracer) ForgetCodeFree(id proc.FileID) (end func()) {
	c := &t.codeFree
	c.mu.Lock()
	f := c.files[id]
	delete(c.files, id)
	c.mu.Unlock()
	if f == nil {
		return func() {}
	}
	return func() {
		<-f.done
		c.mu.Lock()
		ls := f.links
		f.links = nil
		c.mu.Unlock()
		closeAll(ls) //nolint:errcheck // nothing to do about a probe that would not close
	}
}

// CodeFreeFiles is how many files have ct_code_free attached or being
// attached.
func (t *Tracer) CodeFreeFiles() int {
	c := &t.codeFree
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.files)
}

func (t *Tracer) attachCodeFree(f *codeFreeFile, path string, id proc.FileID, off uint64) error {
	if t.objs.CtCodeFree == nil {
		return errors.New("no ct_code_free program loaded")
	}
	fh, err := proc.Open(path, &id)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer fh.Close() // the probe holds the inode, not the descriptor
	ex, err := link.OpenExecutable(proc.FDPath(fh))
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	added, err := t.attach(ex, []site{{name: "code_dealloc", prog: t.objs.CtCodeFree, addr: off}})
	if err != nil {
		return fmt.Errorf("attach to %s's code_dealloc: %w", path, err)
	}
	c := &t.codeFree
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done { // detached meanwhile: these go too
		closeAll(added) //nolint:errcheck // the tracer is being closed
		return errDetached
	}
	// Kept with the file even where it was forgotten meanwhile: its
	// ForgetCodeFree's end closes them once this attach is over.
	f.links = added
	return nil
}

// take hands over the code_dealloc probes, to be closed with the
// tracer's others; no more are attached. Those of files forgotten are
// their ends' (ForgetCodeFree).
func (c *codeFrees) take() []link.Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	var ls []link.Link
	for _, f := range c.files {
		ls = append(ls, f.links...)
		f.links = nil
	}
	return ls
}
