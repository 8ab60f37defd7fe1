/*
 * The few CUDA runtime declarations the stand-in library and the workloads
 * need, written out by hand with the real ABI (no CUDA headers are installed
 * on the test machine, and none may be).
 */
#ifndef CUDATRACE_VMTEST_CUDA_DECLS_H
#define CUDATRACE_VMTEST_CUDA_DECLS_H

#include <stddef.h>

typedef int cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

struct cudaExtent {
	size_t width, height, depth;
};

struct cudaPitchedPtr {
	void *ptr;
	size_t pitch, xsize, ysize;
};

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInvalidDevice = 101,
};

enum { cudaMemAttachGlobal = 1, cudaMemAttachHost = 2 };
enum {
	cudaHostAllocDefault = 0,
	cudaHostAllocPortable = 1,
	cudaHostAllocMapped = 2,
	cudaHostAllocWriteCombined = 4,
};

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream);
cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent);
cudaError_t cudaMallocHost(void **ptr, size_t size);
cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaGetLastError(void);

/* Stand-in only: appends "<name> pid=... tid=... ret=0 ..." to FAKECUDA_LOG. */
void fakecuda_log_marker(const char *name);

#endif
