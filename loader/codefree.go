package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/link"

	"github.com/cudatrace/cudatrace/proc"
)

// AttachCodeFree attaches ct_code_free at off, the file offset of
// code_dealloc in the interpreter file at path, which must be file id;
// once per file (until ForgetCodeFree), the first answer kept. Safe on
// any goroutine. The file is opened through proc.Open (only a regular
// file, that one) and probed through that descriptor, as Attach does.
func (t *Tracer) AttachCodeFree(path string, id proc.FileID, off uint64) error {
	_, err := t.codeFree.attach(id, func() ([]link.Link, error) { return t.attachCodeFree(path, id, off) })
	return err
}

// CodeFreeReady says whether ct_code_free is attached to file id, without
// waiting for an attach under way (AttachCodeFree).
func (t *Tracer) CodeFreeReady(id proc.FileID) bool { return t.codeFree.ready(id) }

// ForgetCodeFree ends file id's probe: from now on CodeFreeReady says
// false for it, and AttachCodeFree attaches a new one. The probe itself
// goes when end is called (fileProbes.forget: off the reader's
// goroutine). The caller knows that no process whose layout was marked
// for this probe still runs (a process's code object frees would go
// uncounted).
func (t *Tracer) ForgetCodeFree(id proc.FileID) (end func()) { return t.codeFree.forget(id) }

// CodeFreeFiles is how many files have ct_code_free attached or being
// attached.
func (t *Tracer) CodeFreeFiles() int { return t.codeFree.count() }

func (t *Tracer) attachCodeFree(path string, id proc.FileID, off uint64) ([]link.Link, error) {
	if t.objs.CtCodeFree == nil {
		return nil, errors.New("no ct_code_free program loaded")
	}
	fh, err := proc.Open(path, &id)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer fh.Close() // the probe holds the inode, not the descriptor
	ex, err := link.OpenExecutable(proc.FDPath(fh))
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	added, err := t.attach(ex, []site{{name: "code_dealloc", prog: t.objs.CtCodeFree, addr: off}})
	if err != nil {
		return nil, fmt.Errorf("attach to %s's code_dealloc: %w", path, err)
	}
	return added, nil
}
