package pystack

import "github.com/cudatrace/cudatrace/proc"

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
