/*
 * shortlived: a handful of allocations and frees, then exit at once. Sizes
 * depend on the pid so that the per-process ledgers of several runs differ.
 */
#include <stdio.h>
#include <unistd.h>

#include "cuda_decls.h"

int main(void)
{
	void *a = NULL, *b = NULL, *h = NULL, *m = NULL, *x = NULL;
	size_t salt = (size_t)(getpid() % 64) * 512;
	int bad = 0;

	bad |= cudaMalloc(&a, (1u << 20) + salt) != 0;
	bad |= cudaMallocHost(&h, 4096 + salt) != 0;
	bad |= cudaSetDevice(1) != 0;
	bad |= cudaMalloc(&b, (2u << 20) + salt) != 0;
	bad |= cudaFree(a) != 0;
	bad |= cudaMalloc(&x, 0) != cudaErrorInvalidValue;
	bad |= cudaMallocManaged(&m, 3000 + salt, cudaMemAttachGlobal) != 0;
	bad |= cudaFreeHost(h) != 0;
	if (bad)
		fprintf(stderr, "shortlived: unexpected return code\n");
	return bad ? 3 : 0; /* b and m stay live */
}
