package events

import "fmt"

// cudaErrors names the cudaError_t values an allocation can return (from
// CUDA's driver_types.h); the driver's CUresult shares the first few codes
// (0, 1, 2, 3, 100, ...) so one table serves both layers for the common ones.
var cudaErrors = map[int32]string{
	0:   "cudaSuccess",
	1:   "cudaErrorInvalidValue",
	2:   "cudaErrorMemoryAllocation",
	3:   "cudaErrorInitializationError",
	4:   "cudaErrorCudartUnloading",
	35:  "cudaErrorInsufficientDriver",
	46:  "cudaErrorDevicesUnavailable",
	100: "cudaErrorNoDevice",
	101: "cudaErrorInvalidDevice",
	201: "cudaErrorDeviceUninitialized",
	222: "cudaErrorUnsupportedPtxVersion",
	400: "cudaErrorInvalidResourceHandle",
	700: "cudaErrorIllegalAddress",
	709: "cudaErrorContextIsDestroyed",
	801: "cudaErrorNotSupported",
	999: "cudaErrorUnknown",
}

// ErrorName names a CUDA runtime error code, or says it is unknown.
func ErrorName(code int32) string {
	if n, ok := cudaErrors[code]; ok {
		return n
	}
	return fmt.Sprintf("cudaError(%d)", code)
}

// IsOOM reports whether code means the device ran out of memory.
func IsOOM(code int32) bool { return code == 2 }
