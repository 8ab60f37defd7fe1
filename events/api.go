// Package events is what the BPF programs report, in Go: the traced
// functions (API, with what each does to memory), the ring-buffer record's
// layout and its decoder (Decode, Encode), and CUDA's error names. It holds
// no state; package ledger accounts for the decoded events.
package events

import "strconv"

// API identifies the traced function. The numbers travel from Go to BPF as
// the uprobe's attach cookie and come back in every record, and they are
// stored in trace files: never renumber, only append.
type API uint16

// Op is what a call does to the ledger.
type Op uint8

const (
	OpAlloc Op = iota + 1
	OpFree
	OpSetDevice
	OpMap       // VMM: physical memory mapped at a virtual address
	OpUnmap     // VMM: a virtual range unmapped
	OpReserve   // VMM: a virtual address range reserved (no memory)
	OpUnreserve // VMM: a reserved range given back
	// A context call: Addr is the context it made current (or retained),
	// Size the thread's current context after it.
	OpContext
	// A context died (destroyed, detached to 0, a primary context's last
	// release or reset): Addr is it (0: a primary context whose retain was
	// not seen), Device its device, Size the thread's current context
	// after. What was allocated in it is freed.
	OpContextEnd
	// The process ended (its last thread exited; bpf/exit.h): what it
	// still held is held at exit, and the driver frees it.
	OpExit
	// Not memory: a word for the reader about the process (a code object
	// captured, an exec, libraries mapped), which the session takes and
	// neither the ledger nor the trace's events see.
	OpNote
)

// Kind says what sort of memory an allocation holds. Every kind but KindHost
// is GPU memory (it counts towards live/peak bytes); KindHost is pinned host
// memory and is reported apart.
type Kind uint8

const (
	KindDevice Kind = iota + 1
	KindManaged
	KindHost
)

func (k Kind) String() string {
	switch k {
	case KindDevice:
		return "device"
	case KindManaged:
		return "managed"
	case KindHost:
		return "host"
	}
	return "unknown"
}

// Layer is the software layer a probe sits in.
type Layer uint8

const (
	LayerRuntime Layer = iota + 1 // libcudart
	LayerDriver                   // libcuda
	LayerTensor                   // a framework's allocator (PyTorch's USDT probes)
)

func (l Layer) String() string {
	switch l {
	case LayerRuntime:
		return "runtime"
	case LayerDriver:
		return "driver"
	case LayerTensor:
		return "tensor"
	}
	return "unknown"
}

const (
	APIUnknown API = iota
	CudaMalloc
	CudaFree
	CudaMallocAsync
	CudaFreeAsync
	CudaMallocFromPoolAsync
	CudaMallocManaged
	CudaMallocPitch
	CudaMalloc3D
	CudaMallocHost
	CudaHostAlloc
	CudaFreeHost
	CudaSetDevice
	CuMemAlloc
	CuMemFree
	CuMemAllocPitch
	CuMemAllocManaged
	CuMemAllocHost
	CuMemHostAlloc
	CuMemFreeHost
	CuMemAllocAsync
	CuMemAllocFromPoolAsync
	CuMemFreeAsync
	CuDevicePrimaryCtxRetain
	CuCtxCreate
	CuCtxSetCurrent
	CuCtxPushCurrent
	CuMemCreate
	CuMemRelease
	TorchMalloc
	TorchFree
	CuCtxPopCurrent
	CuMemMap
	CuMemUnmap
	CuMemAddressReserve
	CuMemAddressFree
	CuCtxDestroy
	CuCtxDetach
	CuCtxAttach
	CuDevicePrimaryCtxRelease
	CuDevicePrimaryCtxReset
	CudaDeviceReset
	CuCtxGetCurrent
	CuCtxGetDevice
	CudaGetDevice
	ProcessExit
	PyCode
	ProcessExec
	LibrariesMapped
	apiEnd
)

// APIInfo describes one traced function.
type APIInfo struct {
	Name  string
	Op    Op
	Kind  Kind // for allocations and frees: the memory they handle
	Layer Layer
}

// apis is each traced function's name and what its calls do, built from
// the groups below: the functions in a group do the same to memory.
var apis = buildAPIs([]apiGroup{
	// The runtime (libcudart).
	{OpAlloc, KindDevice, LayerRuntime, []apiName{{CudaMalloc, "cudaMalloc"}, {CudaMallocAsync, "cudaMallocAsync"}, {CudaMallocFromPoolAsync, "cudaMallocFromPoolAsync"}, {CudaMallocPitch, "cudaMallocPitch"}, {CudaMalloc3D, "cudaMalloc3D"}}},
	{OpFree, KindDevice, LayerRuntime, []apiName{{CudaFree, "cudaFree"}, {CudaFreeAsync, "cudaFreeAsync"}}},
	{OpAlloc, KindManaged, LayerRuntime, []apiName{{CudaMallocManaged, "cudaMallocManaged"}}},
	{OpAlloc, KindHost, LayerRuntime, []apiName{{CudaMallocHost, "cudaMallocHost"}, {CudaHostAlloc, "cudaHostAlloc"}}},
	{OpFree, KindHost, LayerRuntime, []apiName{{CudaFreeHost, "cudaFreeHost"}}},
	{OpSetDevice, 0, LayerRuntime, []apiName{{CudaSetDevice, "cudaSetDevice"}}},
	// The driver (libcuda).
	{OpAlloc, KindDevice, LayerDriver, []apiName{{CuMemAlloc, "cuMemAlloc_v2"}, {CuMemAllocPitch, "cuMemAllocPitch_v2"}, {CuMemAllocAsync, "cuMemAllocAsync"}, {CuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"}}},
	{OpFree, KindDevice, LayerDriver, []apiName{{CuMemFree, "cuMemFree_v2"}, {CuMemFreeAsync, "cuMemFreeAsync"}}},
	{OpAlloc, KindManaged, LayerDriver, []apiName{{CuMemAllocManaged, "cuMemAllocManaged"}}},
	{OpAlloc, KindHost, LayerDriver, []apiName{{CuMemAllocHost, "cuMemAllocHost_v2"}, {CuMemHostAlloc, "cuMemHostAlloc"}}},
	{OpFree, KindHost, LayerDriver, []apiName{{CuMemFreeHost, "cuMemFreeHost"}}},
	// Contexts say which device a thread's driver calls go to (the BPF
	// side keeps each thread's context stack) and which context each
	// allocation belongs to: the ledger frees a context's allocations when
	// it dies. cuCtxAttach is counted in BPF and makes no record.
	{OpContext, 0, LayerDriver, []apiName{{CuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"}, {CuCtxCreate, "cuCtxCreate_v2"}, {CuCtxSetCurrent, "cuCtxSetCurrent"}, {CuCtxPushCurrent, "cuCtxPushCurrent_v2"}, {CuCtxPopCurrent, "cuCtxPopCurrent_v2"}, {CuCtxAttach, "cuCtxAttach"}}},
	{OpContextEnd, 0, LayerDriver, []apiName{{CuCtxDestroy, "cuCtxDestroy_v2"}, {CuCtxDetach, "cuCtxDetach"}, {CuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"}, {CuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2"}}},
	{OpContextEnd, 0, LayerRuntime, []apiName{{CudaDeviceReset, "cudaDeviceReset"}}},
	// VMM physical memory, counted from its creation on the device its
	// properties name until it is released and no longer mapped; Addr is
	// the allocation handle.
	{OpAlloc, KindDevice, LayerDriver, []apiName{{CuMemCreate, "cuMemCreate"}}},
	{OpFree, KindDevice, LayerDriver, []apiName{{CuMemRelease, "cuMemRelease"}}},
	// VMM mappings and address ranges. They hold no memory of their own:
	// a mapping keeps its handle's physical memory alive past cuMemRelease
	// until cuMemUnmap (the driver frees it when both are gone), and the
	// ledger counts mapped and reserved bytes apart.
	{OpMap, KindDevice, LayerDriver, []apiName{{CuMemMap, "cuMemMap"}}},
	{OpUnmap, KindDevice, LayerDriver, []apiName{{CuMemUnmap, "cuMemUnmap"}}},
	{OpReserve, KindDevice, LayerDriver, []apiName{{CuMemAddressReserve, "cuMemAddressReserve"}}},
	{OpUnreserve, KindDevice, LayerDriver, []apiName{{CuMemAddressFree, "cuMemAddressFree"}}},
	// Tensors: blocks PyTorch's caching allocator hands out of the segments
	// it got from cudaMalloc. A second level, accounted apart.
	{OpAlloc, KindDevice, LayerTensor, []apiName{{TorchMalloc, "pytorch:malloc"}}},
	{OpFree, KindDevice, LayerTensor, []apiName{{TorchFree, "pytorch:free"}}},
	// What a thread that ran before tracing began says of its own state:
	// its current context (Addr and Size) and its device (Device), which
	// cudatrace did not see being set. Recorded only when they change what
	// was known; before, its records' device is DeviceUnknown.
	{OpContext, 0, LayerDriver, []apiName{{CuCtxGetCurrent, "cuCtxGetCurrent"}, {CuCtxGetDevice, "cuCtxGetDevice"}}},
	{OpContext, 0, LayerRuntime, []apiName{{CudaGetDevice, "cudaGetDevice"}}},
	// Not a call: the kernel's word that the process ended, made by BPF
	// at its last thread's exit after every record of its threads.
	{OpExit, 0, 0, []apiName{{ProcessExit, "process_exit"}}},
	// Words for the reader (bpf/pycode.h, bpf/notify.h): a CPython code
	// object captured at its first sight in the process (its own record,
	// events.DecodePyCode), the process ran another program, its dynamic
	// loader mapped libraries.
	{OpNote, 0, 0, []apiName{{PyCode, "python_code"}, {ProcessExec, "process_exec"}, {LibrariesMapped, "libraries_mapped"}}},
})

// apiGroup is functions whose calls do the same: Op on memory of Kind.
type apiGroup struct {
	op    Op
	kind  Kind
	layer Layer
	names []apiName
}

type apiName struct {
	api  API
	name string
}

func buildAPIs(groups []apiGroup) [apiEnd]APIInfo {
	t := [apiEnd]APIInfo{APIUnknown: {Name: "unknown"}}
	for _, g := range groups {
		for _, n := range g.names {
			t[n.api] = APIInfo{n.name, g.op, g.kind, g.layer}
		}
	}
	return t
}

// DeviceUnknown is the device of a record made by a thread whose device
// cudatrace has not seen chosen (bpf/cudatrace.h CT_DEV_UNKNOWN): one that
// ran before tracing began and has not yet said which context or device
// is current to it. Never guessed.
const DeviceUnknown int32 = -1

// DeviceName is how users read a device ordinal: the number, or "unknown".
func DeviceName(d int32) string {
	if d == DeviceUnknown {
		return "unknown"
	}
	return strconv.Itoa(int(d))
}

// PrimaryContext reports whether a's context records are about a device's
// primary context.
func (a API) PrimaryContext() bool {
	switch a {
	case CuDevicePrimaryCtxRetain, CuDevicePrimaryCtxRelease, CuDevicePrimaryCtxReset, CudaDeviceReset:
		return true
	}
	return false
}

// Info returns what is known of a; unknown ids (a newer trace file) get a
// placeholder rather than a panic.
func (a API) Info() APIInfo {
	if a < apiEnd {
		return apis[a]
	}
	return APIInfo{Name: "unknown"}
}

func (a API) String() string { return a.Info().Name }

// Segment reports whether the memory a's calls handle counts in a process's
// Live and Peak: GPU memory from the runtime or the driver. Pinned host
// memory is counted apart, and tensors are a level of their own.
func (a API) Segment() bool {
	info := a.Info()
	return (info.Op == OpAlloc || info.Op == OpFree) && info.Kind != KindHost && info.Layer != LayerTensor
}

// APIs lists every known API id, in order.
func APIs() []API {
	out := make([]API, 0, apiEnd-1)
	for i := API(1); i < apiEnd; i++ {
		out = append(out, i)
	}
	return out
}
