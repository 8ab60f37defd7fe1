package pystack

// What reads a Python stack from user space as the walk in BPF does:
// the tests' reference for it (record names frames from BPF's walk and
// captures, never from these).

import (
	"encoding/binary"

	"github.com/cudatrace/cudatrace/proc"
)

// Detect is DetectQuick with what Finish adds.
func Detect(root string, maps []proc.Mapping) (*Interp, error) {
	in, err := DetectQuick(root, maps)
	if in != nil {
		in.Finish()
	}
	return in, err
}

// RawFrame is one frame as the walk in BPF records it (struct ct_pyframe
// in bpf/cudatrace.h): the code object, the instruction in code units
// from its first, and whether it is the outermost frame of the run one C
// call of the interpreter loop executes (3.10: every frame; 3.11:
// is_entry; 3.12 on: the frame before a shim frame).
type RawFrame struct {
	Code  uint64
	Units int32
	Entry bool
}

// RawStack reads thread tid's frames as the walk in BPF does, innermost
// first, at most max of them: what a record of an allocation made while
// no walk in BPF was set up yet (a process's first) would have carried.
// known is false where the thread cannot be told from user space, as
// BPF can: 3.10 threads other than the main one (3.10 keeps only their
// pthread_self, the thread pointer, which /proc does not show). A known
// thread with no frames is one the interpreter does not know or that
// runs no Python.
func (in *Interp) RawStack(pid, tid, max int) (frames []RawFrame, known bool, err error) {
	m := proc.OpenMem(pid)
	ts, known, err := in.thread(m, pid, tid)
	if err != nil || ts == 0 {
		return nil, known, err
	}
	frames, err = in.walk(m, ts, max, max+8)
	return frames, true, err
}

// thread finds thread tid's state: 0 when the interpreter has none for it.
// known is false where a thread's state cannot be told from user space
// (3.10 threads other than the main one).
func (in *Interp) thread(m reader, pid, tid int) (ts uint64, known bool, err error) {
	o := &in.off
	interp, err := u64(m, in.runtime+uint64(o.interpHead))
	if err != nil {
		return 0, false, err
	}
	var mainThread uint64
	if in.Minor == 10 && o.mainThread >= 0 && tid == pid {
		mainThread, _ = u64(m, in.runtime+uint64(o.mainThread))
	}
	known = o.tsNativeID >= 0 || mainThread != 0
	if ts, err = u64(m, interp+uint64(o.interpThreads)); err != nil {
		return 0, known, err
	}
	for i := 0; ts != 0 && i < 4096; i++ {
		var match bool
		if o.tsNativeID >= 0 {
			id, err := u64(m, ts+uint64(o.tsNativeID))
			if err != nil {
				return 0, known, err
			}
			match = id == uint64(tid)
		} else if mainThread != 0 {
			// 3.10 keeps only pthread_self(): the main thread's is known.
			id, err := u64(m, ts+uint64(o.tsThreadID))
			if err != nil {
				return 0, known, err
			}
			match = id == mainThread
		}
		if match {
			return ts, known, nil
		}
		if ts, err = u64(m, ts+uint64(o.tsNext)); err != nil {
			return 0, known, err
		}
	}
	return 0, known, nil
}

// stackRefTags are the low bits of a _PyStackRef (3.14's f_executable)
// that tag the reference rather than address the object.
const stackRefTags = 7

// walk reads thread state ts's frames, innermost first, at most max of
// them in at most steps steps, as frame_step in bpf/python.h
// does: shim frames (3.12 on) are skipped, marking the frame before them
// as an entry, and take steps of their own (BPF takes max + 8).
func (in *Interp) walk(m reader, ts uint64, max, steps int) ([]RawFrame, error) {
	o := &in.off
	var frame uint64
	var err error
	if o.tsCFrame >= 0 {
		cf, err := u64(m, ts+uint64(o.tsCFrame))
		if err != nil || cf == 0 {
			return nil, err
		}
		frame, err = u64(m, cf+uint64(o.cfCurrent))
		if err != nil {
			return nil, err
		}
	} else if frame, err = u64(m, ts+uint64(o.tsFrame)); err != nil {
		return nil, err
	}
	var out []RawFrame
	for step := 0; frame != 0 && step < steps; step++ {
		cur := frame
		if frame, err = u64(m, cur+uint64(o.frPrevious)); err != nil {
			return out, err
		}
		if o.frOwner >= 0 {
			var owner [1]byte
			if err := readAt(m, cur+uint64(o.frOwner), owner[:]); err != nil {
				return out, err
			}
			if owner[0] == versions[in.Minor].entryOwner { // a C call's shim frame
				if len(out) > 0 {
					out[len(out)-1].Entry = true
				}
				continue
			}
		}
		if len(out) >= max {
			break
		}
		code, err := u64(m, cur+uint64(o.frCode))
		if err != nil {
			return out, err
		}
		if in.Minor >= 14 {
			code &^= stackRefTags
		}
		f := RawFrame{Code: code}
		if in.Minor == 10 {
			var b [4]byte
			if err := readAt(m, cur+uint64(o.frInstr), b[:]); err != nil {
				return out, err
			}
			f.Units, f.Entry = int32(binary.LittleEndian.Uint32(b[:])), true
		} else {
			ip, err := u64(m, cur+uint64(o.frInstr))
			if err != nil {
				return out, err
			}
			f.Units = int32((int64(ip) - int64(code) - o.coCodeAdaptive) >> 1)
			if o.frEntry >= 0 {
				var e [1]byte
				if err := readAt(m, cur+uint64(o.frEntry), e[:]); err != nil {
					return out, err
				}
				f.Entry = e[0] != 0
			}
		}
		out = append(out, f)
	}
	return out, nil
}
