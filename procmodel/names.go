package procmodel

import (
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/symbolize"
)

// Symbol is a native frame named while its process ran: what the file
// with build ID BuildID holds at file offset Offset (a return address less
// its mapping's start plus the mapping's offset), so that a reader finds
// it from the process's mappings alone, on a host without that file.
type Symbol struct {
	BuildID string
	Offset  uint64
	Frame   symbolize.Frame // Offset: the address in the file's own ELF terms
}

// Names names the return addresses pcs of the process captured in c, for
// the trace's symbols frames: each one sym names, keyed by its file's
// build ID and file offset. Addresses in files without a build ID are left
// out: nothing would tie the name to the file.
func Names(sym *symbolize.Symbolizer, c *Capture, pcs []uint64) []Symbol {
	maps := sortedMaps(c.Mappings())
	var out []Symbol
	for i, f := range sym.FramesOf(c.Symbol(), maps, pcs) {
		m := MappingOf(maps, pcs[i])
		if m == nil || m.BuildID == "" || f.Function == "" && f.File == "" {
			continue
		}
		out = append(out, Symbol{BuildID: m.BuildID, Offset: pcs[i] - m.Start + m.Offset,
			Frame: symbolize.Frame{Offset: f.Offset, Function: f.Function, File: f.File, Line: f.Line}})
	}
	return out
}

// Teach tells sym the names recorded in syms, for the files of those
// build IDs that this host lacks (symbolize.Symbolizer.Known).
func Teach(sym *symbolize.Symbolizer, syms []Symbol) {
	if sym == nil {
		return
	}
	for _, k := range syms {
		sym.Known(k.BuildID, k.Offset, k.Frame)
	}
}

// MappingOf returns the mapping of maps (sorted by address) holding pc;
// nil when none does.
func MappingOf(maps []proc.Mapping, pc uint64) *proc.Mapping {
	if i := proc.Find(maps, pc); i >= 0 {
		return &maps[i]
	}
	return nil
}
