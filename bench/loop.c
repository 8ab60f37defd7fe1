/*
 * loop N [GO]: N cudaMalloc(1 MiB) + cudaFree pairs against whatever libcudart
 * it was linked with, timed inside the process (tracer start-up is not
 * counted). With GO, a path, it waits until that file exists before the
 * loop: a tracer attached by --pid is then in place (bench/readercpu.sh).
 * Prints: loop: pairs=N ns_per_pair=X
 */
#include <alloca.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_decls.h"

#ifndef PAD_KIB
#define PAD_KIB 64
#endif
/* DEPTH: calls the loop makes each pair through descend before step, so
 * that a stack is that much deeper (bench/progcost.sh's DEPTH, built
 * without frame pointers). */
#ifndef DEPTH
#define DEPTH 0
#endif

__attribute__((noinline)) static int step(void)
{
	void *p = NULL;

	if (cudaMalloc(&p, 1 << 20) != 0)
		return -1;
	return cudaFree(p);
}

/* descend calls itself d times, then step: a frame each, not a loop (the
 * asm after the call keeps it from being a tail call). */
__attribute__((noinline)) static int descend(int d)
{
	if (d <= 0)
		return step();
	int r = descend(d - 1);
	__asm__ volatile("" ::: "memory");
	return r;
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	struct timespec a, b;

	/* 64 KiB of stack above the loop, as a thread deep in a real program
	 * has: a tracer's stack window is then copied in full, not cut short
	 * by the top of the main thread's stack. Built with -DPAD_KIB=0
	 * (loop-shallow), the loop runs a few hundred bytes below it. */
	volatile char *pad = alloca((PAD_KIB << 10) + 8);
	memset((char *)pad, 0, (PAD_KIB << 10) + 8);

	if (argc > 2)
		while (access(argv[2], F_OK) != 0)
			usleep(10000);
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		if (descend(DEPTH) != 0)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("loop: pairs=%ld ns_per_pair=%.0f\n", n, ns / n);
	pad[0] = 1;
	return 0;
}
