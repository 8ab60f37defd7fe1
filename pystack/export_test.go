package pystack

import (
	"encoding/binary"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/proc"
)

// maxFrames bounds a Python stack read.
const maxFrames = 128

// Stack reads the Python stack of thread tid of process pid from user
// space, innermost first: the tests' reference for the walk BPF does. A
// thread without Python frames (or unknown to the interpreter) has none:
// nil and no error.
func (in *Interp) Stack(pid, tid int) ([]Frame, error) {
	m := proc.OpenMem(pid)
	ts, _, err := in.thread(m, pid, tid)
	if err != nil || ts == 0 {
		return nil, err
	}
	raw, err := in.walk(m, ts, maxFrames, 2*maxFrames)
	var out []Frame
	for _, r := range raw {
		fr, err := in.codeFrame(m, r.Code, int64(r.Units))
		if err != nil {
			return out, err
		}
		out = append(out, fr)
	}
	return out, err
}

// captureOf reads the code object at code of process pid as BPF's
// capture does (bpf/pycode.h ct_py_capture): the first bytes of the code
// object and of its file name, (qualified) name and line table objects,
// each as many as the capture takes, or up to its page's end where more
// would cross into an unmapped page; tableBytes bounds the line table's
// part (the capture's 4096, or fewer to cut it).
func (in *Interp) captureOf(pid int, code uint64, tableBytes int) *events.PyCodeCapture {
	m := proc.OpenMem(pid)
	read := func(addr uint64, max int) []byte {
		if addr == 0 {
			return nil
		}
		b := make([]byte, max)
		if m.ReadAt(b, addr) == nil {
			return b
		}
		n := 4096 - int(addr&4095)
		if n >= max {
			return nil
		}
		b = b[:n]
		if m.ReadAt(b, addr) != nil {
			return nil
		}
		return b
	}
	c := &events.PyCodeCapture{PID: uint32(pid), Code: code, Head: read(code, 256)}
	ptr := func(off int64) uint64 {
		if off < 0 || int(off)+8 > len(c.Head) {
			return 0
		}
		return binary.LittleEndian.Uint64(c.Head[off:])
	}
	name := in.off.coName
	if in.off.coQualname >= 0 {
		name = in.off.coQualname
	}
	c.File, c.Name, c.Table = ptr(in.off.coFilename), ptr(name), ptr(in.off.coLinetable)
	c.FileBytes, c.NameBytes, c.TableBytes = read(c.File, 512), read(c.Name, 256), read(c.Table, tableBytes)
	return c
}
