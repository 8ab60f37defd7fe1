package export

import (
	"io"

	"github.com/cudatrace/cudatrace/report"
)

// WriteJSON writes the whole report as JSON (what `cudatrace report --json`
// prints) with, in addition, every allocation live at the end, each naming
// its stack by index.
func WriteJSON(w io.Writer, path string, opts Options) error {
	rep, err := report.Load(path, report.Options{NoSymbolize: opts.NoSymbolize, PIDs: opts.PIDs, Top: opts.Top, Allocations: true})
	if err != nil {
		return err
	}
	if rep.Warning != "" && opts.Warn != nil {
		opts.Warn(rep.Warning)
	}
	return rep.WriteJSON(w)
}
