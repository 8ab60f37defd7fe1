/*
 * nestrt.c: a minimal CUDA runtime over the driver stand-in, as NVIDIA's
 * libcudart is over libcuda: cudaMalloc and cudaFree call cuMemAlloc_v2 and
 * cuMemFree_v2 on the same thread. Built like libcudart (no frame pointers,
 * and no sibling calls: the real runtime does work after the driver call).
 * The driver stand-in's log is the ground truth; this file logs nothing.
 */
#include <stdint.h>

#include "cuda_decls.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	CUdeviceptr d = 0;
	CUresult r;

	if (!devPtr)
		return cudaErrorInvalidValue;
	r = cuMemAlloc_v2(&d, size);
	if (r == CUDA_SUCCESS)
		*devPtr = (void *)(uintptr_t)d;
	return r; /* the runtime's codes have the driver's numbers for these */
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
	CUresult r = cuMemFree_v2((CUdeviceptr)(uintptr_t)devPtr);
	return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
