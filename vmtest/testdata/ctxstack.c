/*
 * ctxstack: the driver's context stack and what dies with a context, in
 * the sequences real clients use (CUDA driver API docs; PyCUDA's
 * Context.detach, which pushes a context that is not current and detaches
 * it, "pop is implicit in detach"). Each step allocates from a named
 * helper (ctx_alloc) and fails once (ctx_fail: more than the device holds)
 * on the device the driver's stack makes current, so a report's devices
 * and failures say whether the tracer followed the stack:
 *   1. create(dev 0), create(dev 1), pop: back on device 0.
 *   2. primary(dev 1) set current, create(dev 0), destroy it: back on
 *      device 1; what was allocated in it is freed with it.
 *   3. create(dev 0), allocate, pop, push it again and detach it (usage
 *      count 0): freed with it, back on device 1.
 *   4. the first context again (device 0): an allocation at the address
 *      the detached context's memory had, freed, and made again.
 *   5. the last release of device 1's primary context frees its memory.
 * Device 0's 1 + 4 MiB stay live at exit. Built with frame pointers,
 * linked with the stand-in libcuda.so.1. Exits non-zero when a call that
 * should succeed fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_decls.h"
#include "cuda_check.h"

#define MiB (1ULL << 20)

__attribute__((noinline)) static CUdeviceptr ctx_alloc(size_t n)
{
	CUdeviceptr p = 0;
	CHECK(cuMemAlloc_v2(&p, n));
	return p;
}

__attribute__((noinline)) static void ctx_fail(void)
{
	CUdeviceptr p = 0;
	if (cuMemAlloc_v2(&p, (size_t)64 << 30) != CUDA_ERROR_OUT_OF_MEMORY)
		bad++;
}

static void want_device(int want, int line)
{
	CUdevice d = -1;
	CHECK(cuCtxGetDevice(&d));
	if (d != want) {
		fprintf(stderr, "ctxstack: on device %d at line %d, want %d\n", d, line, want);
		bad++;
	}
}

int main(void)
{
	CUcontext a, b, c, d, p1;
	CHECK(cuInit(0));

	/* 1. create-create-pop */
	CHECK(cuCtxCreate_v2(&a, 0, 0));
	CHECK(cuCtxCreate_v2(&b, 0, 1));
	CHECK(cuCtxPopCurrent_v2(NULL));
	want_device(0, __LINE__);
	ctx_alloc(1 * MiB);
	ctx_fail();

	/* 2. set-create-destroy */
	CHECK(cuDevicePrimaryCtxRetain(&p1, 1));
	CHECK(cuCtxSetCurrent(p1));
	CHECK(cuCtxCreate_v2(&c, 0, 0));
	ctx_alloc(2 * MiB);
	CHECK(cuCtxDestroy_v2(c));
	want_device(1, __LINE__);
	ctx_alloc(3 * MiB);
	ctx_fail();

	/* 3. detach while not current (PyCUDA) */
	CHECK(cuCtxCreate_v2(&d, 0, 0));
	CUdeviceptr x = ctx_alloc(4 * MiB);
	CHECK(cuCtxPopCurrent_v2(NULL));
	CHECK(cuCtxPushCurrent_v2(d));
	CHECK(cuCtxDetach(d));
	want_device(1, __LINE__);
	ctx_alloc(5 * MiB);
	ctx_fail();

	/* 4. the address comes back after the implicit free */
	CHECK(cuCtxPushCurrent_v2(a));
	want_device(0, __LINE__);
	CUdeviceptr y = ctx_alloc(4 * MiB);
	if (y != x) {
		fprintf(stderr, "ctxstack: reuse got %#llx, want %#llx\n", y, x);
		bad++;
	}
	CHECK(cuMemFree_v2(y));
	ctx_alloc(4 * MiB);
	ctx_fail();
	CHECK(cuCtxPopCurrent_v2(NULL));
	want_device(1, __LINE__);

	/* 5. the last release of a primary context */
	CHECK(cuDevicePrimaryCtxRelease_v2(1));
	CHECK(cuCtxDestroy_v2(b)); /* nothing in it; not current */

	usleep(300000); /* the recorder reads the mappings at the first event */
	printf("ctxstack: bad=%d\n", bad);
	return bad ? 3 : 0;
}
