// Package owner says which component asked for an allocation, from its
// stack: PyTorch's caching allocator, NCCL, cuBLAS, cuDNN, XLA, CuPy,
// Numba, TensorFlow, TensorRT, else the application. It is one table of
// rules (Rules), read the same way by report, top, the agent and the pprof
// export: a frame is known by the file it is in, a native frame by the
// path of its mapping, a Python frame by its source file.
package owner

import (
	"path"
	"strings"

	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
)

// The owners, as labels and report rows spell them. Application is the
// owner of what no rule names; Untraced is not an owner of any allocation
// but the driver's figure (NVML) less what was traced: the CUDA context,
// the modules loaded and what no probe saw.
const (
	PyTorch     = "pytorch"
	NCCL        = "nccl"
	CuBLAS      = "cublas"
	CuDNN       = "cudnn"
	XLA         = "xla"
	CuPy        = "cupy"
	Numba       = "numba"
	TensorFlow  = "tensorflow"
	TensorRT    = "tensorrt"
	Application = "application"
	Untraced    = "context, modules and untraced"
)

// Rule names an owner by the files its frames are in. A frame matches when
// its file's base name matches one of Files (path.Match patterns) or its
// path runs through one of Dirs (a directory, or a run of them, as
// "numba/cuda": a package's files, native extension modules and Python
// sources alike).
type Rule struct {
	Owner string
	Files []string
	Dirs  []string
}

// Rules are the owners, checked in this order against each frame of a
// stack from the innermost out: the first frame a rule names gives the
// owner. The names are the real files': PyTorch wheels' torch/lib/
// libc10_cuda.so (its caching allocator, expandable segments included),
// NCCL's libnccl.so.2 (nvidia-nccl wheels, Debian's libnccl2), cuBLAS's
// libcublas.so.12 and libcublasLt.so.12, cuDNN 8's libcudnn*.so.8 and 9's
// split libcudnn_*.so.9, jaxlib's xla_extension.so and the CUDA PJRT
// plugin jax_plugins/xla_cuda12/xla_cuda_plugin.so, CuPy's cupy/ and
// cupy_backends/ extension modules (cupy/cuda/memory.*.so is its pool,
// cupy_backends/cuda/api/runtime.*.so calls cudaMalloc), Numba's
// numba/cuda/cudadrv/driver.py (it calls the driver through ctypes, so its
// Python frames are what names it), TensorFlow's
// libtensorflow_framework.so.2 and _pywrap_tensorflow_internal.so,
// TensorRT's libnvinfer.so.10.
var Rules = []Rule{
	{Owner: PyTorch, Files: []string{"libc10_cuda.so"}},
	{Owner: NCCL, Files: []string{"libnccl.so*"}},
	{Owner: CuBLAS, Files: []string{"libcublas*.so*"}},
	{Owner: CuDNN, Files: []string{"libcudnn*.so*"}},
	{Owner: XLA, Files: []string{"xla_extension*.so", "libxla*", "xla_cuda_plugin.so"}, Dirs: []string{"jaxlib", "jax_plugins"}},
	{Owner: CuPy, Dirs: []string{"cupy", "cupy_backends"}},
	{Owner: Numba, Dirs: []string{"numba/cuda"}},
	{Owner: TensorFlow, Files: []string{"libtensorflow*", "_pywrap_tensorflow*"}},
	{Owner: TensorRT, Files: []string{"libnvinfer*"}},
}

// CUDA are CUDA's own libraries, which no allocation is charged to: the
// application's module is that of the innermost frame outside them.
var CUDA = Rule{Files: []string{"libcudart.so*", "libcuda.so*", "libnvidia-*"}}

// Names lists every owner an allocation can have, in Rules' order, then
// Application: a label's whole set of values.
func Names() []string {
	out := make([]string, 0, len(Rules)+1)
	for _, r := range Rules {
		out = append(out, r.Owner)
	}
	return append(out, Application)
}

// Frame is what the rules read of one frame: the path of its file (a
// native frame's mapping, a Python frame's source file; "" where unknown).
type Frame struct {
	Path   string
	Python bool
}

// Owner is who asked for an allocation. Module is, for Application, the
// base name of the file of the innermost frame outside CUDA's own
// libraries ("" where none is known); for the others, the file the rule
// named.
type Owner struct {
	Name   string
	Module string
}

// Of is the owner of a stack of frames, innermost first.
func Of(frames []Frame) Owner {
	app := ""
	for _, f := range frames {
		if f.Path == "" {
			continue
		}
		base := path.Base(f.Path)
		if !f.Python && CUDA.matches(f.Path, base) {
			continue
		}
		for i := range Rules {
			if Rules[i].matches(f.Path, base) {
				return Owner{Name: Rules[i].Owner, Module: base}
			}
		}
		if app == "" {
			app = base
		}
	}
	return Owner{Name: Application, Module: app}
}

// OfSymbolized is the owner of symbolized frames (procmodel.Frames'):
// native frames are known by their Module, Python ones by their File.
func OfSymbolized(fs []symbolize.Frame) Owner {
	return Of(FramesOf(len(fs), func(i int) (string, string) { return fs[i].Module, fs[i].File }))
}

// FramesOf makes the rules' frames from n frames given as their module
// (a mapping's path, or pystack.Module for a Python frame) and file.
func FramesOf(n int, at func(i int) (module, file string)) []Frame {
	out := make([]Frame, n)
	for i := range out {
		mod, file := at(i)
		if mod == pystack.Module {
			out[i] = Frame{Path: file, Python: true}
			continue
		}
		if strings.HasPrefix(mod, "/") {
			out[i] = Frame{Path: mod}
		}
	}
	return out
}

func (r *Rule) matches(p, base string) bool {
	for _, pat := range r.Files {
		if ok, _ := path.Match(pat, base); ok {
			return true
		}
	}
	for _, d := range r.Dirs {
		if strings.Contains(p, "/"+d+"/") || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// OfStack is the owner of addrs, a stack of the process captured in c
// (innermost first, Python frames merged in as package pystack does),
// named by files only, without symbolizing: the live views (top, the
// agent) ask it once per stack on the reader's goroutine. py names the
// Python frames (nil: none named).
func OfStack(c *procmodel.Capture, py procmodel.PythonNames, addrs []uint64) Owner {
	fs := make([]symbolize.Frame, len(addrs))
	for i, pc := range addrs {
		fs[i].Addr = pc
	}
	if py != nil {
		py.Fill(fs)
	} else {
		(*pystack.Table)(nil).Fill(fs)
	}
	return OfMapped(c.Mappings(), fs)
}

// OfMapped is the owner of frames (innermost first) of a process with
// mappings maps: a native frame left without a module (not symbolized) is
// known by the mapping holding it.
func OfMapped(maps []proc.Mapping, fs []symbolize.Frame) Owner {
	return Of(FramesOf(len(fs), func(i int) (string, string) {
		f := fs[i]
		if f.Module == "" && f.Addr != 0 && !pystack.IsPython(f.Addr) {
			// A return address: the call is the byte before it, in the
			// caller's mapping even where the call ends one.
			if m := procmodel.MappingOf(maps, f.Addr-1); m != nil {
				return m.Path, f.File
			}
		}
		return f.Module, f.File
	}))
}

// IsCUDA reports whether a native frame's file (its mapping's path) is one
// of CUDA's own libraries, which no allocation is charged to.
func IsCUDA(module string) bool { return module != "" && CUDA.matches(module, path.Base(module)) }
