/*
 * hold: a workload that holds its GPU memory while a test looks at it.
 * Prints "ready" and blocks until a line on stdin; logs the marker "HOLD"
 * to FAKECUDA_LOG; allocates on two devices (and frees some), prints
 * "held", and keeps what it holds until stdin gives another line or ends;
 * then frees all and exits 0 (3 when a call returned what it should not).
 */
#include <stdio.h>

#include "cuda_decls.h"

static int bad;

static void expect(int got, int want, const char *what)
{
	if (got != want) {
		fprintf(stderr, "hold: %s returned %d, want %d\n", what, got, want);
		bad++;
	}
}

/* The stack top should show: noinline, with frame pointers. */
__attribute__((noinline)) static void *hold_alloc(size_t n)
{
	void *p = NULL;
	expect(cudaMalloc(&p, n), 0, "cudaMalloc");
	return p;
}

int main(void)
{
	void *a, *b, *c = NULL, *d, *m = NULL, *h = NULL;
	char line[64];

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "hold: stdin closed before the go line\n");
		return 2;
	}
	fakecuda_log_marker("HOLD");
	expect(cudaSetDevice(0), 0, "cudaSetDevice(0)");
	a = hold_alloc((3u << 20) + 1000);
	b = hold_alloc(1u << 20);
	expect(cudaMallocAsync(&c, 777777, (cudaStream_t)0), 0, "cudaMallocAsync");
	expect(cudaFree(b), 0, "cudaFree b");
	expect(cudaMallocManaged(&m, (2u << 20) + 512, cudaMemAttachGlobal), 0, "cudaMallocManaged");
	expect(cudaSetDevice(1), 0, "cudaSetDevice(1)");
	d = hold_alloc((5u << 20) + 7);
	expect(cudaMallocHost(&h, 64u << 10), 0, "cudaMallocHost");
	printf("held\n");
	fflush(stdout);

	(void)fgets(line, sizeof(line), stdin);
	expect(cudaFree(a), 0, "cudaFree a");
	expect(cudaFree(c), 0, "cudaFree c");
	expect(cudaFree(m), 0, "cudaFree m");
	expect(cudaFree(d), 0, "cudaFree d");
	expect(cudaFreeHost(h), 0, "cudaFreeHost h");
	return bad ? 3 : 0;
}
