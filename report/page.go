package report

// page.go: what the HTML page (export/html*.go) takes of the report
// beyond its models: the header the text report starts with, and the keys
// a stack counts under in the views by function and by line.

import "io"

// WriteHeader writes the text report's header: what was traced, then the
// warnings and notes about the whole trace (events lost, damage, frames
// not named, libraries attached late, Python frames left unresolved,
// processes whose mappings were not read), one a line.
func (r *Report) WriteHeader(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeHeader(ew)
	return ew.err
}

// ViewKeys are the rows of the view by function or by line (--by) that a
// stack of these frames (innermost first) counts in, each once: its Python
// lines (or functions) where it has any, else its native ones.
func ViewKeys(frames []Frame, by By) []string { return viewKeys(frames, by) }

// PathKey is what makes two stacks of a process one call path in the
// report (its stacks' entries): the page merges the same ones.
func PathKey(pid uint32, frames []Frame) string { return pathKey(pid, frames) }
