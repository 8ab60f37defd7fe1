//go:build !cgo

package gpustat

import (
	"errors"
	"testing"
)

func TestOpenWithoutCgo(t *testing.T) {
	src, err := Open()
	if src != nil || !errors.Is(err, ErrUnavailable) || err.Error() != "NVML unavailable: this cudatrace was built without cgo" {
		t.Fatalf("Open = %v, %v", src, err)
	}
}
