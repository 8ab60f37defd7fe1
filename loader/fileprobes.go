package loader

import (
	"errors"
	"sync"

	"github.com/cilium/ebpf/link"

	"github.com/cudatrace/cudatrace/proc"
)

// fileProbes owns probes put in once per file (a program at one place of
// each file: ct_dl_notify on dynamic loaders, dlnotify.go; ct_code_free on
// CPython interpreters, codefree.go), attached from any goroutine, several
// at once: an attach waits out an RCU grace period (5-33 ms here), which
// the reader must not, so its lock is not held while a file is attached.
// A file is tried once and its answer kept (a refusal too: the file does
// not change, and every process that maps it would try it again) until
// it is forgotten: a probe holds its file's inode (a deleted file's
// blocks stay taken while it is in), so the reader ends it once no
// process maps the file (forget).
type fileProbes struct {
	mu    sync.Mutex
	files map[proc.FileID]*fileProbe
	done  bool // detached: no more
}

// fileProbe is one file's attach, made once; err is its answer, links the
// probe (under fileProbes.mu).
type fileProbe struct {
	once  sync.Once
	err   error
	done  chan struct{} // closed once err is the answer
	links []link.Link
}

// ErrDetached: the tracer's probes are gone, and no other is attached.
var ErrDetached = errors.New("the tracer is detached")

// attach puts file id's probe in with put, once until forget: a second
// call has the first's answer, once it is in. now says whether this call
// put it in.
func (c *fileProbes) attach(id proc.FileID, put func() ([]link.Link, error)) (now bool, err error) {
	c.mu.Lock()
	if c.done {
		c.mu.Unlock()
		return false, ErrDetached
	}
	f := c.files[id]
	if f == nil {
		if c.files == nil {
			c.files = map[proc.FileID]*fileProbe{}
		}
		f = &fileProbe{done: make(chan struct{})}
		c.files[id] = f
	}
	c.mu.Unlock()
	f.once.Do(func() {
		defer close(f.done)
		added, err := put()
		if err != nil {
			f.err = err
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.done { // detached meanwhile: these go too
			closeAll(added) //nolint:errcheck // the tracer is being closed
			f.err = ErrDetached
			return
		}
		// Kept with the file even where it was forgotten meanwhile:
		// forget's end closes them once this attach is over.
		f.links, now = added, true
	})
	return now, f.err
}

// ready says whether file id's probe is in, without waiting for an
// attach under way.
func (c *fileProbes) ready(id proc.FileID) bool {
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

// forget ends file id's probe: from now on ready says false for it, and
// attach puts a new one in. The probe itself goes when end is called:
// closing a uprobe waits out an RCU grace period (28-116 ms here), which
// end waits out, with any attach under way (call it off the reader's
// goroutine).
func (c *fileProbes) forget(id proc.FileID) (end func()) {
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

// count is how many files have a probe in or being put in (or refused).
func (c *fileProbes) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.files)
}

// links is how many links the files' probes hold.
func (c *fileProbes) links() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, f := range c.files {
		n += len(f.links)
	}
	return n
}

// take hands over the probes, to be closed with the tracer's others; no
// more are attached. Those of files forgotten are their ends'.
func (c *fileProbes) take() []link.Link {
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
