/*
 * nested ITERS: allocates through the runtime stand-in nestrt (whose calls
 * reach the driver stand-in on the same thread) from alloc_via_runtime, and
 * directly through the driver from alloc_via_driver; frees every other
 * allocation of each. Built with frame pointers.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_decls.h"

__attribute__((noinline)) static void *alloc_via_runtime(size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n) != 0)
		return NULL;
	return p;
}

__attribute__((noinline)) static CUdeviceptr alloc_via_driver(size_t n)
{
	CUdeviceptr d = 0;
	if (cuMemAlloc_v2(&d, n) != CUDA_SUCCESS)
		return 0;
	return d;
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 10;
	CUcontext c;
	if (cuInit(0) != 0 || cuDevicePrimaryCtxRetain(&c, 1) != 0 || cuCtxSetCurrent(c) != 0)
		return 2;
	for (int i = 0; i < iters; i++) {
		void *p = alloc_via_runtime(1000 + (size_t)i);
		CUdeviceptr d = alloc_via_driver(5000 + (size_t)i);
		if (!p || !d)
			return 3;
		if (i % 2) {
			if (cudaFree(p) != 0 || cuMemFree_v2(d) != CUDA_SUCCESS)
				return 4;
		}
	}
	/* Linger: the recorder reads the mappings when a process's first event
	 * arrives, and this test checks symbolized stacks; exiting within
	 * milliseconds of it is TestShortLived's case, not this one's. */
	usleep(300000);
	printf("nested: iters=%d\n", iters);
	return 0;
}
