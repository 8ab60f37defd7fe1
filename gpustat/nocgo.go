//go:build !cgo

package gpustat

import (
	"fmt"

	"github.com/cudatrace/cudatrace/internal/hint"
)

// Open fails in a build without cgo: go-nvml is cgo.
func Open() (Source, error) {
	return nil, hint.Wrap(fmt.Errorf("%w: this cudatrace was built without cgo", ErrUnavailable),
		"build it with CGO_ENABLED=1 (make build) to compare with the driver's figures")
}
