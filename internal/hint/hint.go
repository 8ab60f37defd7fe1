// Package hint attaches to an error the advice a user needs to get past it.
// The CLI prints the error on one line and the hint on the next, instead of
// a stack trace.
package hint

import "errors"

type hinted struct {
	err  error
	hint string
}

func (h *hinted) Error() string { return h.err.Error() }
func (h *hinted) Unwrap() error { return h.err }

// Wrap returns err carrying hint; nil stays nil.
func Wrap(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &hinted{err: err, hint: hint}
}

// Of returns the outermost hint in err's chain, or "".
func Of(err error) string {
	var h *hinted
	if errors.As(err, &h) {
		return h.hint
	}
	return ""
}

// Default returns err carrying hint unless err already carries one: a hint
// for the step (reading a trace) that must not cover a more precise one
// from below (an output path that cannot be written).
func Default(err error, hint string) error {
	if Of(err) != "" {
		return err
	}
	return Wrap(err, hint)
}
