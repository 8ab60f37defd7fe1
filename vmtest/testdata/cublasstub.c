/*
 * cublasstub.c: a stand-in for cuBLAS's libcublas.so.12 as cudatrace's owner
 * rules see it: a handle's workspace, allocated with cudaMalloc when the
 * handle is made and freed with it.
 *
 *   cublasCreate_v2(&handle)  -> 0: a WORKSPACE-byte workspace allocated
 *   cublasDestroy_v2(handle)  -> 0: freed
 */
#include <stdlib.h>

#include "cuda_decls.h"

#define EXPORT __attribute__((visibility("default")))
#define WORKSPACE ((size_t)3 << 20)

struct handle {
	void *workspace;
};

EXPORT int cublasCreate_v2(struct handle **out)
{
	struct handle *h = calloc(1, sizeof(*h));
	if (!h || cudaMalloc(&h->workspace, WORKSPACE) != 0)
		return 3; /* CUBLAS_STATUS_ALLOC_FAILED */
	*out = h;
	return 0;
}

EXPORT int cublasDestroy_v2(struct handle *h)
{
	cudaFree(h->workspace);
	free(h);
	return 0;
}
