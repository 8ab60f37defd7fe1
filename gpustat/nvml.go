//go:build cgo

package gpustat

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/cudatrace/cudatrace/internal/hint"
)

// libraryName is what go-nvml dlopens: the driver installs it, and the
// dynamic loader finds it through the ld.so cache.
const libraryName = "libnvidia-ml.so.1"

// Open starts NVML through go-nvml. Its error wraps ErrUnavailable and
// says why, in NVML's words ("library not found", "Driver Not Loaded"),
// with a hint; the caller goes on without the driver's view.
func Open() (Source, error) { return open(libraryName) }

// go-nvml links its C calls with --unresolved-symbols=ignore-in-object-files
// and lets the dynamic loader bind them, lazily, once dlopen has made
// libnvidia-ml global. Two ways that crashes instead of failing: a call to
// a function the library lacks (an older driver) dies in the loader with
// "symbol lookup error", and in a statically linked binary there is no
// loader to bind anything, so the first call jumps to address 0. So: no
// call before Init has loaded the library, a static binary is refused
// before Init, and every unversioned function is looked up before use
// (go-nvml picks the versioned ones, _v2 and _v3, by lookup itself).
var required = []string{
	"nvmlShutdown",
	"nvmlDeviceGetUUID",
	"nvmlDeviceGetName",
	"nvmlDeviceGetMemoryInfo",
	"nvmlDeviceGetComputeRunningProcesses",
	"nvmlDeviceGetGraphicsRunningProcesses",
}

// initMu serializes Init and Shutdown: go-nvml keeps the chosen versions
// of functions in package variables.
var initMu sync.Mutex

type nvmlSource struct {
	lib   nvml.Interface
	memV2 bool // nvmlDeviceGetMemoryInfo_v2: used excludes reserved memory, as nvidia-smi shows it
	mu    sync.Mutex
}

func open(path string) (Source, error) {
	if err := dynamic(); err != nil {
		return nil, err
	}
	initMu.Lock()
	defer initMu.Unlock()
	lib := nvml.New(nvml.WithLibraryPath(path))
	switch ret := lib.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, hint.Wrap(fmt.Errorf("%w: library not found (%s)", ErrUnavailable, path),
			"install the NVIDIA driver's NVML library (Debian: libnvidia-ml1); without it there is no driver's figure to compare with")
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, hint.Wrap(fmt.Errorf("%w: Driver Not Loaded", ErrUnavailable),
			"the NVIDIA kernel driver is not loaded (no GPU here, or `modprobe nvidia`); `nvidia-smi` says the same")
	case nvml.ERROR_NO_PERMISSION:
		return nil, hint.Wrap(fmt.Errorf("%w: %s", ErrUnavailable, errText(ret)),
			"run as root, or with read-write access to /dev/nvidiactl and /dev/nvidia*")
	default:
		return nil, hint.Wrap(fmt.Errorf("%w: nvmlInit: %s", ErrUnavailable, errText(ret)), "check `nvidia-smi`")
	}
	ext := lib.Extensions()
	for _, sym := range required {
		if err := ext.LookupSymbol(sym); err != nil {
			lib.Shutdown()
			return nil, hint.Wrap(fmt.Errorf("%w: %s lacks %s", ErrUnavailable, path, sym),
				"the NVIDIA driver is too old for cudatrace's NVML queries; update it")
		}
	}
	return &nvmlSource{lib: lib, memV2: ext.LookupSymbol("nvmlDeviceGetMemoryInfo_v2") == nil}, nil
}

// errText is NVML's message for ret with its number, which searches find.
func errText(ret nvml.Return) string { return fmt.Sprintf("%s (%d)", ret.Error(), int32(ret)) }

// dynamic refuses a statically linked cudatrace (no PT_INTERP: no dynamic
// loader to bind go-nvml's calls; see required).
func dynamic() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("%w: find own executable: %v", ErrUnavailable, err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		return fmt.Errorf("%w: read own executable: %v", ErrUnavailable, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return nil
		}
	}
	return hint.Wrap(fmt.Errorf("%w: this cudatrace is statically linked, and NVML can only be loaded into a dynamic one", ErrUnavailable),
		"build it with cgo and without -static (make build)")
}

func (s *nvmlSource) handles() ([]nvml.Device, error) {
	n, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetCount: %s", errText(ret))
	}
	out := make([]nvml.Device, 0, n)
	for i := range n {
		d, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvmlDeviceGetHandleByIndex(%d): %s", i, errText(ret))
		}
		out = append(out, d)
	}
	return out, nil
}

// withHandles calls f with the devices' handles, under the lock, on an
// open source: every query starts so.
func (s *nvmlSource) withHandles(f func(hs []nvml.Device) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lib == nil {
		return errClosed
	}
	hs, err := s.handles()
	if err != nil {
		return err
	}
	return f(hs)
}

func (s *nvmlSource) Devices() ([]Device, error) {
	var out []Device
	err := s.withHandles(func(hs []nvml.Device) error {
		var err error
		out, err = devices(hs, s.memV2)
		return err
	})
	return out, err
}

func devices(hs []nvml.Device, memV2 bool) ([]Device, error) {
	out := make([]Device, 0, len(hs))
	for i, h := range hs {
		d := Device{Index: i}
		var ret nvml.Return
		if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("device %d: nvmlDeviceGetUUID: %s", i, errText(ret))
		}
		if d.Name, ret = h.GetName(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("device %d: nvmlDeviceGetName: %s", i, errText(ret))
		}
		if memV2 {
			m, ret := h.GetMemoryInfo_v2()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("device %d: nvmlDeviceGetMemoryInfo_v2: %s", i, errText(ret))
			}
			d.Total, d.Used, d.Free = m.Total, m.Used, m.Free
		} else {
			m, ret := h.GetMemoryInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("device %d: nvmlDeviceGetMemoryInfo: %s", i, errText(ret))
			}
			d.Total, d.Used, d.Free = m.Total, m.Used, m.Free
		}
		out = append(out, d)
	}
	return out, nil
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long long: the
// driver does not know the process's memory (it runs in another container
// than the caller, or under WDDM).
const notAvailable = ^uint64(0)

func (s *nvmlSource) Processes() ([]ProcessUsage, error) {
	var out []ProcessUsage
	err := s.withHandles(func(hs []nvml.Device) error {
		var err error
		out, err = processes(hs)
		return err
	})
	return out, err
}

func processes(hs []nvml.Device) ([]ProcessUsage, error) {
	var out []ProcessUsage
	for i, h := range hs {
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("device %d: nvmlDeviceGetUUID: %s", i, errText(ret))
		}
		// A process with compute and graphics contexts is on both lists,
		// with the same memory: count it once.
		used := map[uint32]uint64{}
		for _, q := range []struct {
			name string
			get  func() ([]nvml.ProcessInfo, nvml.Return)
		}{
			{"nvmlDeviceGetComputeRunningProcesses", h.GetComputeRunningProcesses},
			{"nvmlDeviceGetGraphicsRunningProcesses", h.GetGraphicsRunningProcesses},
		} {
			infos, ret := q.get()
			if ret == nvml.ERROR_NOT_SUPPORTED {
				continue
			}
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("device %d: %s: %s", i, q.name, errText(ret))
			}
			for _, pi := range infos {
				if pi.UsedGpuMemory == notAvailable {
					continue
				}
				used[pi.Pid] = max(used[pi.Pid], pi.UsedGpuMemory)
			}
		}
		for pid, n := range used {
			out = append(out, ProcessUsage{PID: pid, Device: i, UUID: uuid, Used: n})
		}
	}
	sortProcesses(out)
	return out, nil
}

var errClosed = errors.New("gpustat: source closed")

func (s *nvmlSource) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lib == nil {
		return nil
	}
	initMu.Lock()
	defer initMu.Unlock()
	ret := s.lib.Shutdown()
	s.lib = nil
	if ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlShutdown: %s", errText(ret))
	}
	return nil
}
