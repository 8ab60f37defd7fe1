/*
 * mix THREADS ITERS SEED: each thread runs a deterministic pseudo-random mix
 * (its own PRNG, seeded from SEED + thread index) of every CUDA allocation
 * API, cudaSetDevice (valid and invalid ordinals), failing calls (size 0,
 * sizes over FAKECUDA_MEM_LIMIT), frees of about 70% of what it allocated,
 * and leaves the rest live at exit.
 *
 * Allocations go through named helpers (alloc_device_buffer,
 * alloc_managed_buffer, alloc_pinned_staging, called from worker_main, or
 * from setup_context in main) so tests can check the stacks. Built with frame
 * pointers. At exit it prints its own tally on stdout, one line:
 *   mix: pid=P threads=T iters=I seed=S allocs=N frees=N failed=N
 *        alloc_bytes=N live_bytes=N host_live_bytes=N dev_live=0:N,1:N,...
 *        bad=N
 * and exits 3 if the library misbehaved (bad > 0; details on stderr).
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_decls.h"

#define MAX_DEVICES 16
#define ALIGN 512ULL
#define SENTINEL ((void *)0x5e5e5e5e5e5e5e00ULL)

enum kind { K_DEVICE, K_MANAGED, K_HOST };
enum how { H_MALLOC, H_ASYNC, H_POOL, H_PITCH, H_3D, H_NHOW };

struct rec {
	void *p;
	uint64_t size;
	int kind, dev;
};

struct tally {
	uint64_t allocs, frees, failed, alloc_bytes, host_live;
	uint64_t dev_live[MAX_DEVICES];
};

struct worker {
	int idx, iters, dev;
	uint64_t rng;
	struct rec *pending; /* allocations this thread will free */
	size_t npending, cap;
	struct tally t;
	int bad;
	pthread_t th;
};

static int ndevices = 2;
static uint64_t mem_limit = 1ULL << 30;
static const cudaMemPool_t the_pool = (cudaMemPool_t)0x1000;

static uint64_t rnd(struct worker *w)
{
	/* splitmix64 */
	uint64_t z = (w->rng += 0x9E3779B97F4A7C15ULL);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

static uint64_t rnd_range(struct worker *w, uint64_t lo, uint64_t hi)
{
	return lo + rnd(w) % (hi - lo + 1);
}

static void complain(struct worker *w, const char *what, int ret, uint64_t size)
{
	fprintf(stderr, "mix[%d]: %s (ret=%d size=%" PRIu64 ")\n", w->idx, what, ret, size);
	w->bad++;
}

/* Accounts for one allocation call; keeps it for a later free if asked. */
static void account(struct worker *w, int ret, void *p, uint64_t bytes, int kind, int will_free)
{
	if (ret != cudaSuccess) {
		w->t.failed++;
		if (p != SENTINEL)
			complain(w, "failed allocation wrote its out-pointer", ret, bytes);
		if (ret != cudaErrorInvalidValue && ret != cudaErrorMemoryAllocation)
			complain(w, "unexpected error code", ret, bytes);
		return;
	}
	if (p == NULL || p == SENTINEL || ((uintptr_t)p & (ALIGN - 1)))
		complain(w, "bad address", ret, bytes);
	w->t.allocs++;
	w->t.alloc_bytes += bytes;
	if (kind == K_HOST)
		w->t.host_live += bytes;
	else
		w->t.dev_live[w->dev] += bytes;
	if (!will_free)
		return;
	if (w->npending == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 64;
		w->pending = realloc(w->pending, w->cap * sizeof(*w->pending));
		if (!w->pending)
			abort();
	}
	w->pending[w->npending++] = (struct rec){p, bytes, kind, w->dev};
}

static uint64_t round_pitch(uint64_t width)
{
	return (width + ALIGN - 1) & ~(ALIGN - 1);
}

__attribute__((noinline)) int alloc_device_buffer(struct worker *w, int how, uint64_t want, int will_free)
{
	void *p = SENTINEL;
	uint64_t bytes = want;
	int ret;

	switch (how) {
	case H_MALLOC:
		ret = cudaMalloc(&p, want);
		break;
	case H_ASYNC:
		ret = cudaMallocAsync(&p, want, (cudaStream_t)0);
		break;
	case H_POOL:
		ret = cudaMallocFromPoolAsync(&p, want, the_pool, (cudaStream_t)0);
		break;
	case H_PITCH: {
		size_t height = rnd_range(w, 1, 64), width = want / height, pitch = 12345;
		if (want && !width)
			width = 1;
		ret = cudaMallocPitch(&p, &pitch, width, height);
		if (ret == cudaSuccess && pitch != round_pitch(width))
			complain(w, "bad pitch", ret, width);
		bytes = (uint64_t)pitch * height;
		break;
	}
	default: {
		struct cudaExtent e;
		struct cudaPitchedPtr pp = {SENTINEL, 1, 2, 3};
		e.height = rnd_range(w, 1, 16);
		e.depth = rnd_range(w, 1, 4);
		e.width = want / (e.height * e.depth);
		if (want && !e.width)
			e.width = 1;
		ret = cudaMalloc3D(&pp, e);
		p = pp.ptr;
		if (ret == cudaSuccess &&
		    (pp.pitch != round_pitch(e.width) || pp.xsize != e.width || pp.ysize != e.height))
			complain(w, "bad cudaPitchedPtr", ret, e.width);
		if (ret != cudaSuccess && (pp.pitch != 1 || pp.xsize != 2 || pp.ysize != 3))
			complain(w, "failed cudaMalloc3D wrote its cudaPitchedPtr", ret, want);
		bytes = (uint64_t)pp.pitch * e.height * e.depth;
		break;
	}
	}
	account(w, ret, p, bytes, K_DEVICE, will_free);
	return ret;
}

__attribute__((noinline)) int alloc_managed_buffer(struct worker *w, uint64_t want, int will_free)
{
	void *p = SENTINEL;
	int ret = cudaMallocManaged(&p, want, cudaMemAttachGlobal);
	account(w, ret, p, want, K_MANAGED, will_free);
	return ret;
}

__attribute__((noinline)) int alloc_pinned_staging(struct worker *w, uint64_t want, int will_free)
{
	void *p = SENTINEL;
	int ret;

	if (rnd(w) & 1)
		ret = cudaMallocHost(&p, want);
	else
		ret = cudaHostAlloc(&p, want, cudaHostAllocPortable | cudaHostAllocMapped);
	account(w, ret, p, want, K_HOST, will_free);
	return ret;
}

__attribute__((noinline)) void release_buffer(struct worker *w, size_t i)
{
	struct rec r = w->pending[i];
	int ret;

	w->pending[i] = w->pending[--w->npending];
	if (r.kind == K_HOST)
		ret = cudaFreeHost(r.p);
	else if (r.kind == K_DEVICE && (rnd(w) & 1))
		ret = cudaFreeAsync(r.p, (cudaStream_t)0);
	else
		ret = cudaFree(r.p);
	if (ret != cudaSuccess) {
		complain(w, "free failed", ret, r.size);
		return;
	}
	w->t.frees++;
	if (r.kind == K_HOST)
		w->t.host_live -= r.size;
	else
		w->t.dev_live[r.dev] -= r.size;
}

static void alloc_step(struct worker *w)
{
	uint64_t c = rnd(w) % 100, want;
	int which = (int)(rnd(w) % 10), will_free = rnd(w) % 100 < 70;

	if (c < 5)
		want = 0; /* cudaErrorInvalidValue */
	else if (c < 8)
		want = mem_limit + (1ULL << 20); /* cudaErrorMemoryAllocation */
	else if (c < 45)
		want = rnd_range(w, 1, 4096);
	else if (c < 85)
		want = rnd_range(w, 4097, 1ULL << 20);
	else
		want = rnd_range(w, (1ULL << 20) + 1, 32ULL << 20);

	if (which < 4)
		alloc_device_buffer(w, H_MALLOC, want, will_free);
	else if (which < 8)
		alloc_device_buffer(w, H_ASYNC + (which - 4), want, will_free);
	else if (which == 8)
		alloc_managed_buffer(w, want, will_free);
	else
		alloc_pinned_staging(w, want, will_free);
}

static void set_device(struct worker *w, int d)
{
	int ret = cudaSetDevice(d);
	if (d >= 0 && d < ndevices) {
		if (ret != cudaSuccess)
			complain(w, "cudaSetDevice of a valid ordinal failed", ret, (uint64_t)d);
		else
			w->dev = d;
	} else if (ret != cudaErrorInvalidDevice) {
		complain(w, "cudaSetDevice of an invalid ordinal did not return 101", ret, (uint64_t)d);
	}
}

static void odd_frees(struct worker *w)
{
	void *bogus = (void *)(uintptr_t)(0x10000 + (rnd(w) % 4096) * ALIGN);
	int ret;

	switch (rnd(w) % 5) {
	case 0:
		if ((ret = cudaFree(NULL)) != cudaSuccess)
			complain(w, "cudaFree(NULL) failed", ret, 0);
		break;
	case 1:
		if ((ret = cudaFreeHost(NULL)) != cudaSuccess)
			complain(w, "cudaFreeHost(NULL) failed", ret, 0);
		break;
	case 2:
		if ((ret = cudaFree(bogus)) != cudaErrorInvalidValue)
			complain(w, "cudaFree(bogus) did not return 1", ret, 0);
		break;
	case 3:
		if ((ret = cudaFreeAsync(bogus, (cudaStream_t)0)) != cudaErrorInvalidValue)
			complain(w, "cudaFreeAsync(bogus) did not return 1", ret, 0);
		break;
	default:
		if ((ret = cudaFreeHost(bogus)) != cudaErrorInvalidValue)
			complain(w, "cudaFreeHost(bogus) did not return 1", ret, 0);
		break;
	}
}

void *worker_main(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < w->iters; i++) {
		uint64_t r = rnd(w) % 1000;
		if (r < 30) {
			set_device(w, (int)(rnd(w) % (uint64_t)ndevices));
		} else if (r < 40) {
			set_device(w, ndevices + (int)(rnd(w) % 3));
		} else if (r < 50) {
			int d = -1;
			int ret = cudaGetDevice(&d);
			if (ret != cudaSuccess || d != w->dev)
				complain(w, "cudaGetDevice disagrees", ret, (uint64_t)d);
			cudaGetLastError();
		} else if (r < 60) {
			odd_frees(w);
		} else if (r < 380 && w->npending) {
			release_buffer(w, rnd(w) % w->npending);
		} else {
			alloc_step(w);
		}
	}
	while (w->npending)
		release_buffer(w, rnd(w) % w->npending);
	return NULL;
}

/* The main thread's own allocations, so that some stacks go through main. */
__attribute__((noinline)) void setup_context(struct worker *w)
{
	int ret = cudaFree(NULL); /* the usual "create the context" idiom */
	if (ret != cudaSuccess)
		complain(w, "cudaFree(NULL) failed", ret, 0);
	alloc_device_buffer(w, H_MALLOC, 1ULL << 20, 0);
	alloc_pinned_staging(w, 64ULL << 10, 0);
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *s = getenv(name);
	char *end;
	uint64_t v;

	if (!s || !*s)
		return def;
	v = strtoull(s, &end, 0);
	switch (*end) {
	case 'k': case 'K': v <<= 10; break;
	case 'm': case 'M': v <<= 20; break;
	case 'g': case 'G': v <<= 30; break;
	}
	return v;
}

int main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	int iters = argc > 2 ? atoi(argv[2]) : 300;
	uint64_t seed = argc > 3 ? strtoull(argv[3], NULL, 0) : 1;
	struct worker main_w, *ws;
	struct tally sum;
	int bad;

	if (nthreads < 1 || nthreads > 256 || iters < 0) {
		fprintf(stderr, "usage: mix THREADS ITERS SEED\n");
		return 2;
	}
	ndevices = (int)env_u64("FAKECUDA_DEVICES", 2);
	if (ndevices < 1)
		ndevices = 1;
	if (ndevices > MAX_DEVICES)
		ndevices = MAX_DEVICES;
	mem_limit = env_u64("FAKECUDA_MEM_LIMIT", mem_limit);

	memset(&main_w, 0, sizeof(main_w));
	main_w.idx = -1;
	main_w.rng = seed ^ 0xabcdef;
	setup_context(&main_w);

	ws = calloc((size_t)nthreads, sizeof(*ws));
	if (!ws)
		abort();
	for (int i = 0; i < nthreads; i++) {
		ws[i].idx = i;
		ws[i].iters = iters;
		ws[i].rng = seed + (uint64_t)i;
		if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0) {
			perror("pthread_create");
			return 2;
		}
	}
	sum = main_w.t;
	bad = main_w.bad;
	for (int i = 0; i < nthreads; i++) {
		pthread_join(ws[i].th, NULL);
		sum.allocs += ws[i].t.allocs;
		sum.frees += ws[i].t.frees;
		sum.failed += ws[i].t.failed;
		sum.alloc_bytes += ws[i].t.alloc_bytes;
		sum.host_live += ws[i].t.host_live;
		for (int d = 0; d < ndevices; d++)
			sum.dev_live[d] += ws[i].t.dev_live[d];
		bad += ws[i].bad;
	}
	uint64_t live = 0;
	for (int d = 0; d < ndevices; d++)
		live += sum.dev_live[d];
	printf("mix: pid=%d threads=%d iters=%d seed=%" PRIu64 " allocs=%" PRIu64 " frees=%" PRIu64
	       " failed=%" PRIu64 " alloc_bytes=%" PRIu64 " live_bytes=%" PRIu64 " host_live_bytes=%" PRIu64
	       " dev_live=",
	       (int)getpid(), nthreads, iters, seed, sum.allocs, sum.frees, sum.failed, sum.alloc_bytes, live,
	       sum.host_live);
	for (int d = 0; d < ndevices; d++)
		printf("%s%d:%" PRIu64, d ? "," : "", d, sum.dev_live[d]);
	printf(" bad=%d\n", bad);
	fflush(stdout);
	return bad ? 3 : 0;
}
