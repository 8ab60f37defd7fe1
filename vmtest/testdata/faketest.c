/*
 * faketest: checks the stand-in libcudart's behaviour and ABI. Run with
 * FAKECUDA_DEVICES=2 FAKECUDA_MEM_LIMIT=1048576; prints "faketest: ok" and
 * exits 0, or names each failed check and exits 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_decls.h"

#define DEV0 0x7e0000000000ULL
#define DEV1 (DEV0 + (1ULL << 36))
#define MANAGED 0x7d0000000000ULL
#define HOST 0x7c0000000000ULL
#define LIMIT (1ULL << 20)
#define SENTINEL ((void *)0x5e5e5e5e5e5e5e00ULL)

static int failures;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "faketest:%d: check failed: %s\n", __LINE__, #cond); \
			failures++;                                                   \
		}                                                                     \
	} while (0)

static uint64_t u(void *p) { return (uint64_t)(uintptr_t)p; }

static void *thread_dev(void *arg)
{
	int d = -1;
	CHECK(cudaGetDevice(&d) == 0);
	*(int *)arg = d;
	return NULL;
}

int main(void)
{
	void *p = SENTINEL, *q = SENTINEL, *r = SENTINEL, *s = SENTINEL;
	int d = -1, td = -1;
	size_t pitch = 77;
	pthread_t th;

	/* Devices: per thread, default 0, invalid ordinal 101 and no change. */
	CHECK(cudaGetDevice(&d) == 0 && d == 0);
	CHECK(cudaSetDevice(1) == 0);
	CHECK(cudaSetDevice(2) == cudaErrorInvalidDevice);
	CHECK(cudaSetDevice(-1) == cudaErrorInvalidDevice);
	CHECK(cudaGetDevice(&d) == 0 && d == 1);
	CHECK(pthread_create(&th, NULL, thread_dev, &td) == 0);
	pthread_join(th, NULL);
	CHECK(td == 0);
	CHECK(cudaGetLastError() == cudaErrorInvalidDevice);
	CHECK(cudaGetLastError() == cudaSuccess);

	/* Device 1's range; 512-byte alignment; reuse of a freed address. */
	CHECK(cudaMalloc(&p, 1) == 0 && u(p) == DEV1);
	CHECK(cudaMalloc(&q, 1000) == 0 && u(q) == DEV1 + 512);
	CHECK(cudaMalloc(&r, 10) == 0 && u(r) == DEV1 + 1536);
	CHECK(cudaFree(q) == 0);
	CHECK(cudaFree(q) == cudaErrorInvalidValue); /* double free */
	CHECK(cudaMalloc(&q, 600) == 0 && u(q) == DEV1 + 512);
	CHECK(cudaFree(p) == 0 && cudaFree(q) == 0 && cudaFree(r) == 0);
	CHECK(cudaMalloc(&p, 4096) == 0 && u(p) == DEV1); /* coalesced */
	CHECK(cudaFree(p) == 0);

	/* Failures leave *ptr alone. */
	p = SENTINEL;
	CHECK(cudaMalloc(&p, 0) == cudaErrorInvalidValue && p == SENTINEL);
	CHECK(cudaMalloc(&p, LIMIT + 1) == cudaErrorMemoryAllocation && p == SENTINEL);
	CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
	CHECK(cudaMalloc(NULL, 8) == cudaErrorInvalidValue);

	/* The limit is per device. */
	CHECK(cudaMalloc(&p, LIMIT) == 0 && u(p) == DEV1);
	q = SENTINEL;
	CHECK(cudaMalloc(&q, 1) == cudaErrorMemoryAllocation && q == SENTINEL);
	CHECK(cudaSetDevice(0) == 0);
	CHECK(cudaMallocAsync(&q, LIMIT, (cudaStream_t)0) == 0 && u(q) == DEV0);
	CHECK(cudaFreeAsync(q, (cudaStream_t)0) == 0);
	CHECK(cudaSetDevice(1) == 0);
	CHECK(cudaFree(p) == 0);

	/* Pools need a pool. */
	CHECK(cudaMallocFromPoolAsync(&p, 100, (cudaMemPool_t)0, (cudaStream_t)0) == cudaErrorInvalidValue);
	CHECK(cudaMallocFromPoolAsync(&p, 100, (cudaMemPool_t)0x1000, (cudaStream_t)0) == 0 && u(p) == DEV1);
	CHECK(cudaFree(p) == 0);

	/* Pitch and 3D: pitch = width rounded up to 512. */
	CHECK(cudaMallocPitch(&p, &pitch, 1000, 3) == 0 && pitch == 1024 && u(p) == DEV1);
	{
		struct cudaPitchedPtr pp = {SENTINEL, 1, 2, 3};
		struct cudaExtent e = {513, 4, 5};
		CHECK(cudaMalloc3D(&pp, e) == 0 && pp.pitch == 1024 && pp.xsize == 513 && pp.ysize == 4 &&
		      u(pp.ptr) == DEV1 + 3072);
		CHECK(cudaFree(pp.ptr) == 0);
		e.depth = 0;
		pp = (struct cudaPitchedPtr){SENTINEL, 1, 2, 3};
		CHECK(cudaMalloc3D(&pp, e) == cudaErrorInvalidValue && pp.ptr == SENTINEL && pp.pitch == 1);
		e = (struct cudaExtent){LIMIT, 2, 1};
		CHECK(cudaMalloc3D(&pp, e) == cudaErrorMemoryAllocation && pp.ptr == SENTINEL);
	}
	pitch = 77;
	q = SENTINEL;
	CHECK(cudaMallocPitch(&q, &pitch, 0, 3) == cudaErrorInvalidValue && q == SENTINEL && pitch == 77);
	CHECK(cudaFree(p) == 0);

	/* Managed and pinned host memory: their own ranges; the right free. */
	CHECK(cudaMallocManaged(&p, 100, cudaMemAttachGlobal) == 0 && u(p) == MANAGED);
	CHECK(cudaMallocManaged(&q, 100, 0) == cudaErrorInvalidValue);
	CHECK(cudaMallocHost(&r, 100) == 0 && u(r) == HOST);
	CHECK(cudaHostAlloc(&s, 100, cudaHostAllocMapped) == 0 && u(s) == HOST + 512);
	CHECK(cudaHostAlloc(&q, 100, 0x100) == cudaErrorInvalidValue);
	CHECK(cudaFree(r) == cudaErrorInvalidValue);     /* host memory: not cudaFree */
	CHECK(cudaFreeHost(p) == cudaErrorInvalidValue); /* managed: not cudaFreeHost */
	CHECK(cudaFree(p) == 0);
	CHECK(cudaFreeHost(r) == 0 && cudaFreeHost(s) == 0);
	CHECK(cudaFree(NULL) == 0 && cudaFreeHost(NULL) == 0);
	CHECK(cudaFree((void *)0x10000) == cudaErrorInvalidValue);

	fakecuda_log_marker("END of test");
	if (failures) {
		fprintf(stderr, "faketest: %d checks failed\n", failures);
		return 1;
	}
	printf("faketest: ok\n");
	return 0;
}
