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
	ShapeLearnPop    = Shape(bpf.CudatraceCtShapeCT_SHAPE_LEARN_POP)    // (CUcontext *out): the context popped
)

// shapePrograms names each shape's entry program (bpf/cudatrace.bpf.c),
// under the name of the program that makes its record at return; under
// "" those whose entry probe makes the record.
var shapePrograms = map[string]map[Shape]string{
	bpf.CudatraceProgCtExit: {
		ShapeAlloc: bpf.CudatraceProgCtAllocEnter, ShapePitch: bpf.CudatraceProgCtPitchEnter,
		Shape3D: bpf.CudatraceProgCt3dEnter, ShapeSetDevice: bpf.CudatraceProgCtSetdevEnter,
		ShapeVMMCreate: bpf.CudatraceProgCtVmmCreateEnter, ShapeVMMMap: bpf.CudatraceProgCtVmmMapEnter,
	},
	bpf.CudatraceProgCtCtxExit: {ShapeCtxRetain: bpf.CudatraceProgCtCtxretainEnter, ShapeCtxCreate: bpf.CudatraceProgCtCtxcreateEnter},
	bpf.CudatraceProgCtLearnExit: {
		ShapeLearnCtx: bpf.CudatraceProgCtLearnCtxEnter, ShapeLearnCtxDev: bpf.CudatraceProgCtLearnCtxdevEnter,
		ShapeLearnRtDev: bpf.CudatraceProgCtLearnRtdevEnter, ShapeLearnPop: bpf.CudatraceProgCtLearnPopEnter,
	},
	"": {
		ShapeFree: bpf.CudatraceProgCtFreeEnter, ShapeSizedFree: bpf.CudatraceProgCtSizedFreeEnter,
		ShapeCtxSet: bpf.CudatraceProgCtCtxsetEnter, ShapeCtxPush: bpf.CudatraceProgCtCtxpushEnter,
		ShapeCtxPop: bpf.CudatraceProgCtCtxpopEnter, ShapeCtxDestroy: bpf.CudatraceProgCtCtxdestroyEnter,
		ShapeCtxDetach: bpf.CudatraceProgCtCtxdetachEnter, ShapeCtxAttach: bpf.CudatraceProgCtCtxattachEnter,
		ShapePrimaryRelease: bpf.CudatraceProgCtPrimaryReleaseEnter, ShapePrimaryReset: bpf.CudatraceProgCtPrimaryResetEnter,
		ShapeDeviceReset: bpf.CudatraceProgCtDevresetEnter,
	},
}

// Returns says whether a probe of shape s has a return probe besides its
// entry probe (its record is made at return).
func (s Shape) Returns() bool {
	_, entryOnly := shapePrograms[""][s]
	return !entryOnly
}

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
	required(events.CudaMalloc, ShapeAlloc), required(events.CudaFree, ShapeFree),
	optional(events.CudaMallocAsync, ShapeAlloc), optional(events.CudaFreeAsync, ShapeFree),
	optional(events.CudaMallocFromPoolAsync, ShapeAlloc),
	optional(events.CudaMallocManaged, ShapeAlloc), optional(events.CudaMallocPitch, ShapePitch), optional(events.CudaMalloc3D, Shape3D),
	// Pinned host memory.
	optional(events.CudaMallocHost, ShapeAlloc), optional(events.CudaHostAlloc, ShapeAlloc), optional(events.CudaFreeHost, ShapeFree),
	optional(events.CudaSetDevice, ShapeSetDevice), optional(events.CudaDeviceReset, ShapeDeviceReset),
}

// DriverProbes are libcuda's. JAX/XLA, NCCL (cuMem* since 2.19) and
// PyTorch's expandable segments allocate here without the runtime; a
// runtime call that reaches the driver on the same thread is nested in the
// BPF programs' eyes and counts once, as the runtime call. The context
// calls tell the BPF side each thread's device.
var DriverProbes = []Probe{
	required(events.CuMemAlloc, ShapeAlloc), required(events.CuMemFree, ShapeFree),
	optional(events.CuMemAllocPitch, ShapePitch), optional(events.CuMemAllocManaged, ShapeAlloc),
	// Pinned host memory.
	optional(events.CuMemAllocHost, ShapeAlloc), optional(events.CuMemHostAlloc, ShapeAlloc), optional(events.CuMemFreeHost, ShapeFree),
	optional(events.CuMemAllocAsync, ShapeAlloc), optional(events.CuMemAllocFromPoolAsync, ShapeAlloc), optional(events.CuMemFreeAsync, ShapeFree),
	// Contexts made current, then those that die.
	optional(events.CuDevicePrimaryCtxRetain, ShapeCtxRetain), optional(events.CuCtxCreate, ShapeCtxCreate),
	optional(events.CuCtxSetCurrent, ShapeCtxSet), optional(events.CuCtxPushCurrent, ShapeCtxPush), optional(events.CuCtxPopCurrent, ShapeCtxPop),
	popV1(ShapeCtxPop),
	optional(events.CuCtxDestroy, ShapeCtxDestroy), optional(events.CuCtxDetach, ShapeCtxDetach), optional(events.CuCtxAttach, ShapeCtxAttach),
	optional(events.CuDevicePrimaryCtxRelease, ShapePrimaryRelease), optional(events.CuDevicePrimaryCtxReset, ShapePrimaryReset),
	// VMM: physical memory, then its mappings and address ranges.
	optional(events.CuMemCreate, ShapeVMMCreate), optional(events.CuMemRelease, ShapeFree),
	optional(events.CuMemMap, ShapeVMMMap), optional(events.CuMemUnmap, ShapeSizedFree),
	optional(events.CuMemAddressReserve, ShapeAlloc), optional(events.CuMemAddressFree, ShapeSizedFree),
}

// LearnProbes tell a thread's current context and device from its own
// calls: attached only while some thread that ran before tracing began
// allocates on a device, or in a context, not yet known (Tracer.Learn), never required, and
// not part of what makes a library a CUDA library (Tables).
var LearnProbes = []Probe{
	optional(events.CuCtxGetCurrent, ShapeLearnCtx),
	optional(events.CuCtxGetDevice, ShapeLearnCtxDev),
	optional(events.CudaGetDevice, ShapeLearnRtDev),
	// Beside DriverProbes' entry probe: the context a thread popped, where
	// it was made current before tracing began.
	optional(events.CuCtxPopCurrent, ShapeLearnPop), popV1(ShapeLearnPop),
}

// popV1 is cuCtxPopCurrent, the name before CUDA 4.0 (cuda.h now defines
// it as cuCtxPopCurrent_v2): same arguments, same stack. Where a library
// has both at one address, that address is probed once (Tracer.Attach).
func popV1(s Shape) Probe { return Probe{"cuCtxPopCurrent", events.CuCtxPopCurrent, s, false} }

// required and optional make a row: the symbol is the API's name.
func required(api events.API, s Shape) Probe { return Probe{api.Info().Name, api, s, true} }
func optional(api events.API, s Shape) Probe { return Probe{api.Info().Name, api, s, false} }

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
