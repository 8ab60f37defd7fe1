/*
 * owners.c: a program whose GPU memory has four owners, each through a
 * stand-in named and behaving as the real library: PyTorch's caching
 * allocator (libc10_cuda.so, c10stub.c: 2 MiB segments from cudaMalloc),
 * NCCL (libnccl.so.2, ncclstub.c: VMM memory from cuMemCreate/cuMemMap),
 * cuBLAS (libcublas.so.12, cublasstub.c: a 3 MiB workspace from cudaMalloc)
 * and its own cudaMalloc calls.
 *
 * Live at the end: on device 0, pytorch 4 MiB (three 1 MiB tensors: two
 * segments) and application 5 MiB (own_buffer); on device 1, nccl 4 MiB;
 * cuBLAS's workspace is freed. At the peak (scratch_buffer's 64 MiB, live
 * for a moment): the same, with cublas 3 MiB and application 69 MiB.
 * "exit N" exits N after all that; "wait" says "owners: ready" and waits
 * for a line on stdin (or its end) before exiting. Needs FAKECUDA_DEVICES=2: NCCL's memory
 * is on device 1, where the runtime stand-in's addresses (device 0's)
 * cannot meet the driver stand-in's handles (the two stand-ins are two
 * libraries, each with its own arenas, which the real ones are not).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_decls.h"

#define MiB ((size_t)1 << 20)

void *c10_alloc(size_t size, int device);
int nccl_stub_init(int device, int chunks);
int cublasCreate_v2(void **handle);
int cublasDestroy_v2(void *handle);

__attribute__((noinline)) static void *own_buffer(size_t n)
{
	void *p = NULL;
	return cudaMalloc(&p, n) == 0 ? p : NULL;
}

__attribute__((noinline)) static int scratch_buffer(size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n) != 0)
		return -1;
	return cudaFree(p);
}

int main(int argc, char **argv)
{
	void *blas = NULL;
	for (int i = 0; i < 3; i++)
		if (!c10_alloc(MiB, 0))
			return 1;
	if (nccl_stub_init(1, 2) != 0 || cublasCreate_v2(&blas) != 0 || !own_buffer(5 * MiB))
		return 1;
	if (scratch_buffer(64 * MiB) != 0)
		return 1;
	cublasDestroy_v2(blas);
	printf("owners: done\n");
	if (argc == 3 && strcmp(argv[1], "exit") == 0)
		return atoi(argv[2]);
	if (argc == 2 && strcmp(argv[1], "wait") == 0) {
		printf("owners: ready\n");
		fflush(stdout);
		getchar();
	}
	return 0;
}
