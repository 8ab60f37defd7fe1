package replay

import (
	"errors"
	"fmt"
	"io"

	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/tracefile"
)

// Processes reads the trace at path for its processes alone: each PID's
// first capture (its command line, job and rank, node), without applying
// an event. It is how a process is chosen by its rank before a replay.
// A trace cut short gives the processes before the cut.
func Processes(path string) (map[uint32]*procmodel.Capture, error) {
	r, err := tracefile.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	out := map[uint32]*procmodel.Capture{}
	for {
		rec, err := r.Next()
		switch {
		case err == io.EOF, errors.Is(err, tracefile.ErrTruncated), errors.Is(err, tracefile.ErrCorrupt):
			return out, nil
		case err != nil:
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if rec.Type == tracefile.TypeProcess {
			if _, ok := out[rec.Process.PID]; !ok {
				out[rec.Process.PID] = procmodel.FromFile(rec.Process)
			}
		}
	}
}
