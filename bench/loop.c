/*
 * loop N: N cudaMalloc(1 MiB) + cudaFree pairs against whatever libcudart it
 * was linked with, timed inside the process (tracer start-up is not counted).
 * Prints: loop: pairs=N ns_per_pair=X
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_decls.h"

__attribute__((noinline)) static int step(void)
{
	void *p = NULL;

	if (cudaMalloc(&p, 1 << 20) != 0)
		return -1;
	return cudaFree(p);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++)
		if (step() != 0)
			return 1;
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("loop: pairs=%ld ns_per_pair=%.0f\n", n, ns / n);
	return 0;
}
