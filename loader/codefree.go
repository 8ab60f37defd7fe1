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
// not held while a file is attached.
type codeFrees struct {
	mu    sync.Mutex
	files map[proc.FileID]*codeFreeFile
	links []link.Link
	done  bool // detached: no more
}

// codeFreeFile is one file's attach, made once; err is its answer.
type codeFreeFile struct {
	once sync.Once
	err  error
	done chan struct{} // closed once err is the answer
}

// errDetached: the tracer's probes are gone, and no other is attached.
var errDetached = errors.New("the tracer is detached")

// AttachCodeFree attaches ct_code_free at off, the file offset of
// code_dealloc in the interpreter file at path, which must be file id;
// once per file, the first answer kept. Safe on any goroutine. The file
// is opened through proc.Open (only a regular file, that one) and probed
// through that descriptor, as Attach does.
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
		f.err = t.attachCodeFree(path, id, off)
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

func (t *Tracer) attachCodeFree(path string, id proc.FileID, off uint64) error {
	if t.objs.CtCodeFree == nil {
		return errors.New("no ct_code_free program loaded")
	}
	f, err := proc.Open(path, &id)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close() // the probe holds the inode, not the descriptor
	ex, err := link.OpenExecutable(proc.FDPath(f))
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
	c.links = append(c.links, added...)
	return nil
}

// take hands over the code_dealloc probes, to be closed with the
// tracer's others; no more are attached.
func (c *codeFrees) take() []link.Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.done = true
	ls := c.links
	c.links = nil
	return ls
}
