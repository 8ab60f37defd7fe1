//go:build cgo

package gpustat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cudatrace/cudatrace/internal/hint"
)

// With no library at the path, Open fails with "library not found" and a
// hint, and nothing crashes: go-nvml's C functions are bound lazily and
// none may be called before the library is loaded.
func TestOpenLibraryNotFound(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	src, err := open(missing)
	if src != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("open(%s) = %v, %v; want ErrUnavailable", missing, src, err)
	}
	if want := "NVML unavailable: library not found (" + missing + ")"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if h := hint.Of(err); !strings.Contains(h, "libnvidia-ml1") {
		t.Errorf("hint %q does not say what to install", h)
	}
}

// This host's own NVML: Debian's libnvidia-ml1 without an NVIDIA driver
// (CI installs it; there is no GPU) says "Driver Not Loaded". On a host
// with a driver, Open works and lists devices.
func TestOpenHost(t *testing.T) {
	_, libErr := os.Stat("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
	_, drvErr := os.Stat("/proc/driver/nvidia/version")
	src, err := Open()
	switch {
	case drvErr == nil && libErr == nil:
		if err != nil {
			t.Fatalf("Open with a driver: %v", err)
		}
		defer src.Close()
		devs, err := src.Devices()
		if err != nil || len(devs) == 0 {
			t.Fatalf("Devices: %v, %v", devs, err)
		}
		for _, d := range devs {
			if !strings.HasPrefix(d.UUID, "GPU-") || d.Total == 0 || d.Used+d.Free > d.Total {
				t.Errorf("device %+v", d)
			}
		}
		if _, err := src.Processes(); err != nil {
			t.Errorf("Processes: %v", err)
		}
	case libErr == nil:
		if err == nil || err.Error() != "NVML unavailable: Driver Not Loaded" {
			t.Fatalf("Open with libnvidia-ml and no driver: %v, want Driver Not Loaded", err)
		}
		if h := hint.Of(err); !strings.Contains(h, "modprobe nvidia") {
			t.Errorf("hint %q", h)
		}
	default:
		if err == nil || !strings.HasPrefix(err.Error(), "NVML unavailable: library not found") {
			t.Fatalf("Open without libnvidia-ml: %v, want library not found", err)
		}
	}
}
