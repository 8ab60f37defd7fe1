/*
 * burst N: allocations made while the tracer's reader is kept away (the
 * test stops it), so that the ring buffer fills. One allocation first,
 * then "ready" on stdout; at a line on stdin, N allocations of 1 MiB from
 * burst_alloc (noinline, with frame pointers, called from burst_loop), then
 * "done"; at another line (or the end of stdin) it exits 0, holding all
 * N+1 MiB. Exits 3 when an allocation fails.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_decls.h"

static int bad;

__attribute__((noinline)) static void burst_alloc(void)
{
	void *p = NULL;
	if (cudaMalloc(&p, 1 << 20) != 0)
		bad++;
}

__attribute__((noinline)) static void burst_loop(int n)
{
	for (int i = 0; i < n; i++)
		burst_alloc();
}

static void wait_line(void)
{
	char line[64];
	if (!fgets(line, sizeof(line), stdin))
		return;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 16;
	burst_alloc();
	printf("ready\n");
	fflush(stdout);
	wait_line();
	burst_loop(n);
	printf("done\n");
	fflush(stdout);
	wait_line();
	return bad ? 3 : 0;
}
