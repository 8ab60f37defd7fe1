package events

import "fmt"

// cudaErrors names the cudaError_t values an allocation can return (from
// CUDA's driver_types.h).
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

// cuErrors names the CUresult values a driver allocation can return (from
// CUDA's cuda.h). Many share their number with a runtime code, not always
// its meaning (201 is an invalid context to the driver).
var cuErrors = map[int32]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	400: "CUDA_ERROR_INVALID_HANDLE",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	999: "CUDA_ERROR_UNKNOWN",
}

// ErrorName names a CUDA runtime error code, or says it is unknown.
func ErrorName(code int32) string {
	if n, ok := cudaErrors[code]; ok {
		return n
	}
	return fmt.Sprintf("cudaError(%d)", code)
}

// ResultName names what a call returned: a cudaError_t for the runtime's
// functions, a CUresult for the driver's.
func (a API) ResultName(code int32) string {
	if a.Info().Layer != LayerDriver {
		return ErrorName(code)
	}
	if n, ok := cuErrors[code]; ok {
		return n
	}
	return fmt.Sprintf("CUresult(%d)", code)
}

// IsOOM reports whether code means the device ran out of memory:
// cudaErrorMemoryAllocation and CUDA_ERROR_OUT_OF_MEMORY are both 2.
func IsOOM(code int32) bool { return code == 2 }
