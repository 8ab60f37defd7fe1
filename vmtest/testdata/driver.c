/*
 * driver ITERS: the driver API alone, as JAX/XLA and NCCL use it. Two
 * threads, each on its own device through a context: thread 0 retains
 * device 0's primary context and makes it current (cuCtxSetCurrent), thread
 * 1 creates a context on device 1 (current at once), later pushes device
 * 0's, and pops it to be back on device 1. Each allocates through every cuMem* entry point from named
 * helpers (drv_alloc_device, drv_alloc_pinned), fails once per iteration
 * (a size over FAKECUDA_MEM_LIMIT: CUDA_ERROR_OUT_OF_MEMORY), and frees
 * about half of what it made. Thread 0 also creates VMM physical memory on
 * device 1 (cuMemCreate names its device in its properties, whatever the
 * current context) and releases every other one, then does what PyTorch's
 * expandable segments and CUDA's samples do: reserves a virtual range, maps
 * chunks of devices 0 and 1 into it, releases some handles while they are
 * still mapped (the memory stays until unmapped), and unmaps in one call
 * and in several. Built with frame pointers; linked with the
 * stand-in libcuda.so.1. Exits non-zero when a call the workload expects to
 * succeed fails.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_decls.h"
#include "cuda_check.h"

static int iters = 20;
static CUcontext primary0;

__attribute__((noinline)) static CUdeviceptr drv_alloc_device(int i)
{
	CUdeviceptr p = 0;
	size_t pitch = 0;
	CUmemoryPool pool = (CUmemoryPool)0x1;

	switch (i % 5) {
	case 0:
		CHECK(cuMemAlloc_v2(&p, 4096 + 512 * (size_t)i));
		break;
	case 1:
		CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 3 + (size_t)i, 4));
		break;
	case 2:
		CHECK(cuMemAllocManaged(&p, 8192, 1));
		break;
	case 3:
		CHECK(cuMemAllocAsync(&p, 65536, NULL));
		break;
	case 4:
		CHECK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, NULL));
		break;
	}
	return p;
}

__attribute__((noinline)) static void *drv_alloc_pinned(int i)
{
	void *h = NULL;
	if (i % 2)
		CHECK(cuMemAllocHost_v2(&h, 2048));
	else
		CHECK(cuMemHostAlloc(&h, 3072, 0));
	return h;
}

__attribute__((noinline)) static CUmemGenericAllocationHandle drv_vmm_create(int dev, size_t size)
{
	CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = dev}};
	CUmemGenericAllocationHandle h = 0;
	CHECK(cuMemCreate(&h, size, &prop, 0));
	return h;
}

static void work(void)
{
	CUdeviceptr keep[64];
	int n = 0;
	for (int i = 0; i < iters; i++) {
		CUdeviceptr p = drv_alloc_device(i);
		void *h = drv_alloc_pinned(i);
		CUdeviceptr huge = 0;
		if (cuMemAlloc_v2(&huge, (size_t)1 << 40) != CUDA_ERROR_OUT_OF_MEMORY)
			__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
		if (i % 2) {
			CHECK(i % 4 == 1 ? cuMemFreeAsync(p, NULL) : cuMemFree_v2(p));
			CHECK(cuMemFreeHost(h));
		} else if (n < 64) {
			keep[n++] = p;
		}
	}
	(void)keep;
}

/*
 * vmm_mapped: 6 chunks of 2 MiB mapped at va, alternately on devices 0 and
 * 1. Chunks 0-3 are released at once (mapped: still held), 4 and 5 kept.
 * One cuMemUnmap over chunks 0-2 frees those three; chunk 3 stays mapped
 * and held; chunk 4 is unmapped and then released; chunk 5 stays mapped,
 * unreleased. Left at the end: chunks 3 and 5 (4 MiB), mapped, and the
 * reservation.
 */
__attribute__((noinline)) static void vmm_mapped(void)
{
	const size_t chunk = (size_t)2 << 20;
	CUdeviceptr va = 0;
	CUmemGenericAllocationHandle h[6];
	CHECK(cuMemAddressReserve(&va, 16 * chunk, 0, 0, 0));
	for (int i = 0; i < 6; i++) {
		h[i] = drv_vmm_create(i % 2, chunk);
		CHECK(cuMemMap(va + i * chunk, chunk, 0, h[i], 0));
	}
	for (int i = 0; i < 4; i++)
		CHECK(cuMemRelease(h[i]));
	CHECK(cuMemUnmap(va, 3 * chunk));
	CHECK(cuMemUnmap(va + 4 * chunk, chunk));
	CHECK(cuMemRelease(h[4]));
	/* A throwaway range: reserved and given back. */
	CUdeviceptr va2 = 0;
	CHECK(cuMemAddressReserve(&va2, chunk, 0, 0, 0));
	CHECK(cuMemAddressFree(va2, chunk));
}

static void *thread1(void *arg)
{
	CUcontext c1;
	(void)arg;
	CHECK(cuCtxCreate_v2(&c1, 0, 1));
	work();
	CHECK(cuCtxPushCurrent_v2(primary0));
	work();
	CHECK(cuCtxPopCurrent_v2(NULL)); /* back on device 1 */
	work();
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t;
	if (argc > 1)
		iters = atoi(argv[1]);
	CHECK(cuInit(0));
	CHECK(cuDevicePrimaryCtxRetain(&primary0, 0));
	CHECK(cuCtxSetCurrent(primary0));
	if (pthread_create(&t, NULL, thread1, NULL) != 0)
		return 2;
	work();
	for (int i = 0; i < iters; i++) {
		CUmemGenericAllocationHandle h = drv_vmm_create(1, (size_t)2 << 20);
		if (i % 2)
			CHECK(cuMemRelease(h));
	}
	vmm_mapped();
	pthread_join(t, NULL);
	/* Linger: the recorder reads the mappings when a process's first event
	 * arrives, and this test checks symbolized stacks; exiting within
	 * milliseconds of it is TestShortLived's case, not this one's. */
	usleep(300000);
	printf("driver: iters=%d bad=%d\n", iters, bad);
	return bad ? 3 : 0;
}
