package owner

import (
	"testing"

	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
	"github.com/cudatrace/cudatrace/pystack"
	"github.com/cudatrace/cudatrace/symbolize"
)

func native(paths ...string) []Frame {
	out := make([]Frame, len(paths))
	for i, p := range paths {
		out[i] = Frame{Path: p}
	}
	return out
}

func TestOf(t *testing.T) {
	sp := "/venv/lib/python3.12/site-packages/"
	for _, c := range []struct {
		name   string
		frames []Frame
		want   Owner
	}{
		{"pytorch", native("/usr/lib/libcudart.so.12", sp+"torch/lib/libc10_cuda.so", sp+"torch/lib/libtorch_cuda.so", "/usr/bin/python3.12"),
			Owner{PyTorch, "libc10_cuda.so"}},
		{"nccl wheel", native(sp+"nvidia/nccl/lib/libnccl.so.2", sp+"torch/lib/libtorch_cuda.so"), Owner{NCCL, "libnccl.so.2"}},
		{"nccl debian", native("/usr/lib/x86_64-linux-gnu/libnccl.so.2.18.3"), Owner{NCCL, "libnccl.so.2.18.3"}},
		{"cublasLt", native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", sp+"nvidia/cublas/lib/libcublasLt.so.12", sp+"nvidia/cublas/lib/libcublas.so.12"),
			Owner{CuBLAS, "libcublasLt.so.12"}},
		{"cudnn 9", native(sp + "nvidia/cudnn/lib/libcudnn_engines_precompiled.so.9"), Owner{CuDNN, "libcudnn_engines_precompiled.so.9"}},
		{"jax plugin", native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", sp+"jax_plugins/xla_cuda12/xla_cuda_plugin.so"), Owner{XLA, "xla_cuda_plugin.so"}},
		{"jaxlib", native(sp + "jaxlib/xla_extension.so"), Owner{XLA, "xla_extension.so"}},
		{"cupy", native("/usr/local/cuda/lib64/libcudart.so.12", sp+"cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so", sp+"cupy/cuda/memory.cpython-312-x86_64-linux-gnu.so"),
			Owner{CuPy, "runtime.cpython-312-x86_64-linux-gnu.so"}},
		{"numba via ctypes", []Frame{{Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}, {Path: "/usr/lib/x86_64-linux-gnu/libffi.so.8"},
			{Path: sp + "numba/cuda/cudadrv/driver.py", Python: true}, {Path: "/home/me/train.py", Python: true}}, Owner{Numba, "driver.py"}},
		{"tensorflow", native(sp + "tensorflow/libtensorflow_framework.so.2"), Owner{TensorFlow, "libtensorflow_framework.so.2"}},
		{"tensorflow pywrap", native(sp + "tensorflow/python/_pywrap_tensorflow_internal.so"), Owner{TensorFlow, "_pywrap_tensorflow_internal.so"}},
		{"tensorrt", native(sp + "tensorrt_libs/libnvinfer.so.10"), Owner{TensorRT, "libnvinfer.so.10"}},
		{"application", native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib/libnvidia-ptxjitcompiler.so.1", "", "/opt/app/bin/train", sp+"torch/lib/libc10_cuda.so"),
			Owner{PyTorch, "libc10_cuda.so"}},
		{"application direct", native("/usr/lib/libcudart.so.12", "", "/opt/app/bin/train", "/usr/lib/x86_64-linux-gnu/libc.so.6"), Owner{Application, "train"}},
		{"libtorch_cuda is not the allocator", native(sp + "torch/lib/libtorch_cuda.so"), Owner{Application, "libtorch_cuda.so"}},
		{"nothing known", native("", ""), Owner{Application, ""}},
		{"a python file named libcuda.so is a file", []Frame{{Path: "/x/libcuda.so.py", Python: true}}, Owner{Application, "libcuda.so.py"}},
	} {
		if got := Of(c.frames); got != c.want {
			t.Errorf("%s: Of = %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestOfSymbolized(t *testing.T) {
	fs := []symbolize.Frame{{Module: "/usr/lib/libcudart.so.12"}, {Module: "[anon]"},
		{Module: pystack.Module, File: "/site-packages/numba/cuda/cudadrv/driver.py"}}
	if got := OfSymbolized(fs); got != (Owner{Numba, "driver.py"}) {
		t.Errorf("OfSymbolized = %+v", got)
	}
}

func TestOfStack(t *testing.T) {
	c := &procmodel.Capture{PID: 7, Maps: []proc.Mapping{
		{Start: 0x1000, End: 0x2000, Path: "/opt/app/workload"},
		{Start: 0x10000, End: 0x20000, Path: "/opt/lib/libnccl.so.2"},
		{Start: 0x30000, End: 0x40000, Path: "/opt/lib/libcudart.so.12"},
	}}
	if got := OfStack(c, nil, []uint64{0x30010, 0x10020, 0x1100}); got != (Owner{NCCL, "libnccl.so.2"}) {
		t.Errorf("OfStack = %+v", got)
	}
	// A return address at the end of a mapping is a call from inside it.
	if got := OfStack(c, nil, []uint64{0x30010, 0x2000}); got != (Owner{Application, "workload"}) {
		t.Errorf("OfStack at a mapping's end = %+v", got)
	}
	if got := OfStack(nil, nil, []uint64{0x1100}); got != (Owner{Application, ""}) {
		t.Errorf("OfStack without a capture = %+v", got)
	}
}

func TestNames(t *testing.T) {
	n := Names()
	if len(n) != 10 || n[0] != PyTorch || n[len(n)-1] != Application {
		t.Errorf("Names = %v", n)
	}
}
