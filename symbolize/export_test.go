package symbolize

import "github.com/cudatrace/cudatrace/proc"

// Frames is FramesOf for a process that sees the tracer's own files: the
// tests' fixtures run on the host. Only tests call it; the tracer always
// knows the process.
func (s *Symbolizer) Frames(maps []proc.Mapping, addrs []uint64) []Frame {
	return s.FramesOf(Proc{}, maps, addrs)
}
