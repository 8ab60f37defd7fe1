// Package loader finds CUDA libraries, attaches cudatrace's BPF programs to
// their allocation entry points, and reads the records the programs submit.
// It owns every BPF object and link it creates.
package loader

import (
	"github.com/cudatrace/cudatrace/bpf"
	"github.com/cudatrace/cudatrace/events"
)

// Shape names an argument layout; each has one entry program. Its values
// are bpf/cudatrace.h's enum ct_shape, through bpf2go's generated twin.
type Shape uint8

const (
	ShapeAlloc     = Shape(bpf.CudatraceCtShapeCT_SHAPE_ALLOC)      // (T **out, size_t size, ...)
	ShapePitch     = Shape(bpf.CudatraceCtShapeCT_SHAPE_PITCH)      // (T **out, size_t *pitch, size_t width, size_t height)
	Shape3D        = Shape(bpf.CudatraceCtShapeCT_SHAPE_3D)         // (cudaPitchedPtr *out, cudaExtent by value)
	ShapeFree      = Shape(bpf.CudatraceCtShapeCT_SHAPE_FREE)       // (T *ptr, ...), recorded at entry
	ShapeSetDevice = Shape(bpf.CudatraceCtShapeCT_SHAPE_SETDEV)     // (int device)
	ShapeCtxRetain = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_RETAIN) // (CUcontext *out, CUdevice dev)
	ShapeCtxCreate = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_CREATE) // (CUcontext *out, unsigned flags, CUdevice dev), made current
	ShapeCtxSet    = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_SET)    // (CUcontext ctx), made current
	ShapeCtxPush   = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_PUSH)   // (CUcontext ctx), pushed: made current, the one before saved
	ShapeCtxPop    = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_POP)    // (CUcontext *out): the saved one current again
	ShapeVMMCreate = Shape(bpf.CudatraceCtShapeCT_SHAPE_VMM_CREATE) // (handle *out, size_t size, const CUmemAllocationProp *prop, ...)
	ShapeVMMMap    = Shape(bpf.CudatraceCtShapeCT_SHAPE_VMM_MAP)    // (CUdeviceptr va, size_t size, size_t offset, handle, ...)
	ShapeSizedFree = Shape(bpf.CudatraceCtShapeCT_SHAPE_SIZED_FREE) // (T *ptr, size_t size), recorded at entry
	// Contexts that die (what was allocated in them is freed), at entry.
	ShapeCtxDestroy     = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_DESTROY)     // (CUcontext ctx)
	ShapeCtxDetach      = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_DETACH)      // (CUcontext ctx), dies at usage count 0
	ShapeCtxAttach      = Shape(bpf.CudatraceCtShapeCT_SHAPE_CTX_ATTACH)      // (CUcontext *out, flags): one use more
	ShapePrimaryRelease = Shape(bpf.CudatraceCtShapeCT_SHAPE_PRIMARY_RELEASE) // (CUdevice dev), dies at the last release
	ShapePrimaryReset   = Shape(bpf.CudatraceCtShapeCT_SHAPE_PRIMARY_RESET)   // (CUdevice dev)
	ShapeDeviceReset    = Shape(bpf.CudatraceCtShapeCT_SHAPE_DEVICE_RESET)    // (void): the current device's
	// Calls that tell what a thread set before tracing began, probed at
	// return while the tracer is learning (Tracer.Learn).
	ShapeLearnCtx    = Shape(bpf.CudatraceCtShapeCT_SHAPE_LEARN_CTX)    // (CUcontext *out)
	ShapeLearnCtxDev = Shape(bpf.CudatraceCtShapeCT_SHAPE_LEARN_CTXDEV) // (CUdevice *out)
	ShapeLearnRtDev  = Shape(bpf.CudatraceCtShapeCT_SHAPE_LEARN_RTDEV)  // (int *out)
)

// Probe is one row of the attach table: adding an API is adding a row.
type Probe struct {
	Symbol   string
	API      events.API
	Shape    Shape
	Required bool // a library that has any row of its table must have these
}

// RuntimeProbes are libcudart's allocation entry points. cudaMalloc and
// cudaFree exist in every CUDA version; the others arrived later (async and
// pools in 11.2) and are skipped, and reported, where a library lacks them.
var RuntimeProbes = []Probe{
	{"cudaMalloc", events.CudaMalloc, ShapeAlloc, true},
	{"cudaFree", events.CudaFree, ShapeFree, true},
	{"cudaMallocAsync", events.CudaMallocAsync, ShapeAlloc, false},
	{"cudaFreeAsync", events.CudaFreeAsync, ShapeFree, false},
	{"cudaMallocFromPoolAsync", events.CudaMallocFromPoolAsync, ShapeAlloc, false},
	{"cudaMallocManaged", events.CudaMallocManaged, ShapeAlloc, false},
	{"cudaMallocPitch", events.CudaMallocPitch, ShapePitch, false},
	{"cudaMalloc3D", events.CudaMalloc3D, Shape3D, false},
	{"cudaMallocHost", events.CudaMallocHost, ShapeAlloc, false},
	{"cudaHostAlloc", events.CudaHostAlloc, ShapeAlloc, false},
	{"cudaFreeHost", events.CudaFreeHost, ShapeFree, false},
	{"cudaSetDevice", events.CudaSetDevice, ShapeSetDevice, false},
	{"cudaDeviceReset", events.CudaDeviceReset, ShapeDeviceReset, false},
}

// DriverProbes are libcuda's. JAX/XLA, NCCL (cuMem* since 2.19) and
// PyTorch's expandable segments allocate here without the runtime; a
// runtime call that reaches the driver on the same thread is nested in the
// BPF programs' eyes and counts once, as the runtime call. The context
// calls tell the BPF side each thread's device.
var DriverProbes = []Probe{
	{"cuMemAlloc_v2", events.CuMemAlloc, ShapeAlloc, true},
	{"cuMemFree_v2", events.CuMemFree, ShapeFree, true},
	{"cuMemAllocPitch_v2", events.CuMemAllocPitch, ShapePitch, false},
	{"cuMemAllocManaged", events.CuMemAllocManaged, ShapeAlloc, false},
	{"cuMemAllocHost_v2", events.CuMemAllocHost, ShapeAlloc, false},
	{"cuMemHostAlloc", events.CuMemHostAlloc, ShapeAlloc, false},
	{"cuMemFreeHost", events.CuMemFreeHost, ShapeFree, false},
	{"cuMemAllocAsync", events.CuMemAllocAsync, ShapeAlloc, false},
	{"cuMemAllocFromPoolAsync", events.CuMemAllocFromPoolAsync, ShapeAlloc, false},
	{"cuMemFreeAsync", events.CuMemFreeAsync, ShapeFree, false},
	{"cuDevicePrimaryCtxRetain", events.CuDevicePrimaryCtxRetain, ShapeCtxRetain, false},
	{"cuCtxCreate_v2", events.CuCtxCreate, ShapeCtxCreate, false},
	{"cuCtxSetCurrent", events.CuCtxSetCurrent, ShapeCtxSet, false},
	{"cuCtxPushCurrent_v2", events.CuCtxPushCurrent, ShapeCtxPush, false},
	{"cuCtxPopCurrent_v2", events.CuCtxPopCurrent, ShapeCtxPop, false},
	{"cuCtxDestroy_v2", events.CuCtxDestroy, ShapeCtxDestroy, false},
	{"cuCtxDetach", events.CuCtxDetach, ShapeCtxDetach, false},
	{"cuCtxAttach", events.CuCtxAttach, ShapeCtxAttach, false},
	{"cuDevicePrimaryCtxRelease_v2", events.CuDevicePrimaryCtxRelease, ShapePrimaryRelease, false},
	{"cuDevicePrimaryCtxReset_v2", events.CuDevicePrimaryCtxReset, ShapePrimaryReset, false},
	{"cuMemCreate", events.CuMemCreate, ShapeVMMCreate, false},
	{"cuMemRelease", events.CuMemRelease, ShapeFree, false},
	{"cuMemMap", events.CuMemMap, ShapeVMMMap, false},
	{"cuMemUnmap", events.CuMemUnmap, ShapeSizedFree, false},
	{"cuMemAddressReserve", events.CuMemAddressReserve, ShapeAlloc, false},
	{"cuMemAddressFree", events.CuMemAddressFree, ShapeSizedFree, false},
}

// LearnProbes tell a thread's current context and device from its own
// calls: attached only while some thread that ran before tracing began
// allocates on a device not yet known (Tracer.Learn), never required, and
// not part of what makes a library a CUDA library (Tables).
var LearnProbes = []Probe{
	{"cuCtxGetCurrent", events.CuCtxGetCurrent, ShapeLearnCtx, false},
	{"cuCtxGetDevice", events.CuCtxGetDevice, ShapeLearnCtxDev, false},
	{"cudaGetDevice", events.CudaGetDevice, ShapeLearnRtDev, false},
}

// Tables lists every attach table. A library is probed with each table of
// which it exports at least one symbol, so a program that links the runtime
// statically is handled like libcudart itself.
var Tables = []struct {
	Name   string
	Probes []Probe
}{
	{"CUDA runtime", RuntimeProbes},
	{"CUDA driver", DriverProbes},
}
