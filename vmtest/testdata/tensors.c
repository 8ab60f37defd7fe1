/*
 * tensors ITERS: a training-loop-shaped use of the c10 stand-in's tensors
 * on devices 0 and 1, from named helpers (make_activation, make_weight).
 * Prints its own tensor-level tally:
 *   tensors: allocs=N frees=N alloc_bytes=N live=N peak=N
 * live and peak in bytes as requested (the probes report the requested size).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void *c10_alloc(size_t size, int device);
void c10_free(void *p);

static uint64_t allocs, frees, alloc_bytes, live, peak;

static void *track(void *p, size_t size)
{
	if (!p)
		exit(3);
	allocs++;
	alloc_bytes += size;
	live += size;
	if (live > peak)
		peak = live;
	return p;
}

static void untrack(void *p, size_t size)
{
	c10_free(p);
	frees++;
	live -= size;
}

__attribute__((noinline)) static void *make_weight(size_t size, int dev)
{
	return track(c10_alloc(size, dev), size);
}

__attribute__((noinline)) static void *make_activation(size_t size, int dev)
{
	return track(c10_alloc(size, dev), size);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 10;
	make_weight(100000, 0);
	make_weight(30000, 1);
	for (int i = 0; i < iters; i++) {
		size_t a = 4096 + 512 * (size_t)(i % 3), b = 70000;
		void *x = make_activation(a, i % 2);
		void *y = make_activation(b, 0);
		untrack(x, a);
		if (i % 3)
			untrack(y, b);
	}
	/* Linger: the recorder reads the mappings when a process's first event
	 * arrives, and this test checks symbolized stacks; exiting within
	 * milliseconds of it is TestShortLived's case, not this one's. */
	usleep(300000);
	printf("tensors: allocs=%llu frees=%llu alloc_bytes=%llu live=%llu peak=%llu\n",
	       (unsigned long long)allocs, (unsigned long long)frees, (unsigned long long)alloc_bytes,
	       (unsigned long long)live, (unsigned long long)peak);
	return 0;
}
