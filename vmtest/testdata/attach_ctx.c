/*
 * attach_ctx: threads that chose their device before a tracer attached
 * with --pid (issue 17). Before the attach, every thread makes device 1
 * current: with the driver (mode "drv": a primary context made current
 * with cuCtxSetCurrent) or the runtime (mode "rt": cudaSetDevice). The
 * process then prints "ready" and waits for a line on stdin; after it, it
 * logs the marker PHASE2 and allocates, its threads one after another:
 *
 *   drv, main thread: two allocations before anything says its device
 *     (between the markers UNSEEN and SEEN: a tracer cannot know it), the
 *     second after cuCtxGetCurrent (its context, not its device); then
 *     cuCtxGetDevice and one on device 1; a context of device 0 pushed,
 *     one there; popped, one on device 1 again.
 *   drv, second thread: Numba's way, cuCtxGetCurrent and cuCtxGetDevice
 *     before its allocation (device 1).
 *   rt, main thread: one allocation unseen, then cudaGetDevice and one
 *     on device 1; a new thread (started after the attach: device 0, the
 *     runtime's default) allocates once.
 *
 * Nothing is freed after the attach, but in mode "destroy": the main thread
 * creates a context of device 1 before the attach (current, unseen) and
 * allocates 1 MiB in it; after the go line, 2 MiB (context and device
 * unknown to a tracer), cuCtxGetCurrent (its context, not its device),
 * 3 MiB, then cuCtxDestroy: the driver frees the three. A new context of
 * device 1 and 2 MiB in it, at an address the destroyed context's memory
 * had (the stand-in's first fit), left live.
 *
 * Mode "pop", PyCUDA's ctx.pop(); ctx.detach(): the main thread creates
 * a context of device 1 before the attach (current, unseen) and allocates
 * 1 MiB in it; after the go line, 2 MiB (context and device unknown to a
 * tracer), cuCtxGetDevice (its device, not its context), 3 MiB on device
 * 1, then pops the context and detaches it (its last use): the driver
 * frees the 2 and 3 MiB (and the 1 MiB) with it. Mode "popv1" does the
 * same with cuCtxPopCurrent, the name before CUDA 4.0.
 *
 * Every call is checked; it exits 3 if one returns what it should not.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_decls.h"


static int bad;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int turn; /* 1: the second thread is set up; 2: its go; 3: it is done */
static CUcontext c1;

static void expect(int got, int want, const char *what)
{
	if (got != want) {
		fprintf(stderr, "attach_ctx: %s returned %d, want %d\n", what, got, want);
		bad++;
	}
}

static void set_turn(int n)
{
	pthread_mutex_lock(&mu);
	turn = n;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
}

static void wait_turn(int n)
{
	pthread_mutex_lock(&mu);
	while (turn < n)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
}

__attribute__((noinline)) static void *numba_thread(void *arg)
{
	CUcontext c = NULL;
	CUdevice d = -1;
	CUdeviceptr p = 0;
	(void)arg;
	expect(cuCtxSetCurrent(c1), 0, "thread cuCtxSetCurrent(device 1)");
	set_turn(1);
	wait_turn(2);
	expect(cuCtxGetCurrent(&c), 0, "thread cuCtxGetCurrent");
	expect(cuCtxGetDevice(&d), 0, "thread cuCtxGetDevice");
	expect(d, 1, "thread's device");
	expect(cuMemAlloc_v2(&p, 7u << 20), 0, "thread cuMemAlloc 7 MiB");
	set_turn(3);
	return NULL;
}

static int drv(void)
{
	CUcontext c0 = NULL, c = NULL;
	CUdevice d = -1;
	CUdeviceptr p = 0;
	pthread_t th;
	char line[64];

	expect(cuInit(0), 0, "cuInit");
	expect(cuDevicePrimaryCtxRetain(&c1, 1), 0, "cuDevicePrimaryCtxRetain(1)");
	expect(cuCtxSetCurrent(c1), 0, "cuCtxSetCurrent(device 1)");
	expect(cuMemAlloc_v2(&p, 1u << 20), 0, "cuMemAlloc before the attach");
	if (pthread_create(&th, NULL, numba_thread, NULL) != 0) {
		perror("pthread_create");
		return 2;
	}
	wait_turn(1);
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "attach_ctx: stdin closed before the go line\n");
		return 2;
	}
	fakecuda_log_marker("PHASE2");
	fakecuda_log_marker("UNSEEN");
	expect(cuMemAlloc_v2(&p, 2u << 20), 0, "cuMemAlloc 2 MiB");
	expect(cuCtxGetCurrent(&c), 0, "cuCtxGetCurrent");
	expect(c == c1, 1, "the current context is device 1's");
	expect(cuMemAlloc_v2(&p, 3u << 20), 0, "cuMemAlloc 3 MiB");
	fakecuda_log_marker("SEEN");
	expect(cuCtxGetDevice(&d), 0, "cuCtxGetDevice");
	expect(d, 1, "the device");
	expect(cuMemAlloc_v2(&p, 4u << 20), 0, "cuMemAlloc 4 MiB");
	expect(cuDevicePrimaryCtxRetain(&c0, 0), 0, "cuDevicePrimaryCtxRetain(0)");
	expect(cuCtxPushCurrent_v2(c0), 0, "cuCtxPushCurrent(device 0)");
	expect(cuMemAlloc_v2(&p, 512u << 10), 0, "cuMemAlloc 512 KiB on device 0");
	expect(cuCtxPopCurrent_v2(&c), 0, "cuCtxPopCurrent");
	expect(cuMemAlloc_v2(&p, 8u << 20), 0, "cuMemAlloc 8 MiB");
	set_turn(2);
	wait_turn(3);
	pthread_join(th, NULL);
	return 0;
}

__attribute__((noinline)) static void *late_thread(void *arg)
{
	void *p = NULL;
	(void)arg;
	expect(cudaMalloc(&p, 9u << 20), 0, "new thread cudaMalloc 9 MiB");
	return NULL;
}

static int rt(void)
{
	void *p = NULL;
	int d = -1;
	pthread_t th;
	char line[64];

	expect(cudaSetDevice(1), 0, "cudaSetDevice(1)");
	expect(cudaMalloc(&p, 1u << 20), 0, "cudaMalloc before the attach");
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "attach_ctx: stdin closed before the go line\n");
		return 2;
	}
	fakecuda_log_marker("PHASE2");
	fakecuda_log_marker("UNSEEN");
	expect(cudaMalloc(&p, 5u << 20), 0, "cudaMalloc 5 MiB");
	fakecuda_log_marker("SEEN");
	expect(cudaGetDevice(&d), 0, "cudaGetDevice");
	expect(d, 1, "the device");
	expect(cudaMalloc(&p, 6u << 20), 0, "cudaMalloc 6 MiB");
	if (pthread_create(&th, NULL, late_thread, NULL) != 0) {
		perror("pthread_create");
		return 2;
	}
	pthread_join(th, NULL);
	return 0;
}

/* Modes destroy and pop, before the attach: a context of device 1 made
 * (current) and 1 MiB in it at *p; "ready", the go line, the marker PHASE2.
 * Returns 2 if stdin closes first. */
static int created_before(CUcontext *c, CUdeviceptr *p)
{
	char line[64];

	expect(cuInit(0), 0, "cuInit");
	expect(cuCtxCreate_v2(c, 0, 1), 0, "cuCtxCreate(device 1) before the attach");
	expect(cuMemAlloc_v2(p, 1u << 20), 0, "cuMemAlloc before the attach");
	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "attach_ctx: stdin closed before the go line\n");
		return 2;
	}
	fakecuda_log_marker("PHASE2");
	return 0;
}

static int destroy(void)
{
	CUcontext c = NULL, cur = NULL, c2 = NULL;
	CUdeviceptr p = 0, q = 0, r = 0, s = 0;

	if (created_before(&c, &p))
		return 2;
	expect(cuMemAlloc_v2(&q, 2u << 20), 0, "cuMemAlloc 2 MiB");
	expect(cuCtxGetCurrent(&cur), 0, "cuCtxGetCurrent");
	expect(cur == c, 1, "the current context is the one created");
	expect(cuMemAlloc_v2(&r, 3u << 20), 0, "cuMemAlloc 3 MiB");
	expect(cuCtxDestroy_v2(c), 0, "cuCtxDestroy");
	expect(cuCtxCreate_v2(&c2, 0, 1), 0, "cuCtxCreate(device 1)");
	expect(cuMemAlloc_v2(&s, 2u << 20), 0, "cuMemAlloc 2 MiB in the new context");
	expect(s == p || s == q || s == r, 1, "an address of the destroyed context's memory reused");
	return 0;
}

static int pop(CUresult (*pop_current)(CUcontext *))
{
	CUcontext c = NULL, popped = NULL;
	CUdevice d = -1;
	CUdeviceptr p = 0;

	if (created_before(&c, &p))
		return 2;
	expect(cuMemAlloc_v2(&p, 2u << 20), 0, "cuMemAlloc 2 MiB");
	expect(cuCtxGetDevice(&d), 0, "cuCtxGetDevice");
	expect(d, 1, "the device");
	expect(cuMemAlloc_v2(&p, 3u << 20), 0, "cuMemAlloc 3 MiB");
	expect(pop_current(&popped), 0, "cuCtxPopCurrent");
	expect(popped == c, 1, "the context popped is the one created");
	expect(cuCtxDetach(c), 0, "cuCtxDetach");
	return 0;
}

int main(int argc, char **argv)
{
	int ret;
	if (argc != 2 || (strcmp(argv[1], "drv") && strcmp(argv[1], "rt") && strcmp(argv[1], "destroy") &&
			  strcmp(argv[1], "pop") && strcmp(argv[1], "popv1"))) {
		fprintf(stderr, "usage: attach_ctx drv|rt|destroy|pop|popv1\n");
		return 2;
	}
	if (strcmp(argv[1], "destroy") == 0)
		ret = destroy();
	else if (strcmp(argv[1], "pop") == 0)
		ret = pop(cuCtxPopCurrent_v2);
	else if (strcmp(argv[1], "popv1") == 0)
		ret = pop(cuCtxPopCurrent);
	else
		ret = strcmp(argv[1], "drv") == 0 ? drv() : rt();
	return ret ? ret : bad ? 3 : 0;
}
