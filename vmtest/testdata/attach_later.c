/*
 * attach_later: allocates a first phase, prints "ready" on stdout, blocks
 * until it reads a line on stdin, logs the marker line "PHASE2" to
 * FAKECUDA_LOG (through the stand-in's fakecuda_log_marker), then runs a
 * second phase of allocations and frees (some of them frees of phase-1
 * pointers, which a tracer attached in between never saw allocated) and
 * exits. Every call is checked; it exits 3 if one returns what it should not.
 *
 * Phase 2 sets its device explicitly before allocating (a tracer attached
 * late cannot know what cudaSetDevice said before), and its second thread is
 * joined before the main thread goes on, so the order of events is fixed.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_decls.h"

static int bad;

static void expect(int got, int want, const char *what)
{
	if (got != want) {
		fprintf(stderr, "attach_later: %s returned %d, want %d\n", what, got, want);
		bad++;
	}
}

__attribute__((noinline)) static void *late_thread(void *arg)
{
	void *p = NULL;
	(void)arg;
	/* A new thread starts on device 0. */
	expect(cudaMalloc(&p, 2u << 20), 0, "thread cudaMalloc");
	expect(cudaMallocAsync(&p, 3000, (cudaStream_t)0), 0, "thread cudaMallocAsync");
	expect(cudaFreeAsync(p, (cudaStream_t)0), 0, "thread cudaFreeAsync");
	return NULL;
}

int main(void)
{
	void *a = NULL, *b = NULL, *c = NULL, *h = NULL, *m = NULL;
	void *p1 = NULL, *p2 = NULL, *p3 = NULL, *p4 = NULL, *h2 = NULL, *m2 = NULL, *x = NULL;
	size_t pitch = 0;
	char line[64];
	pthread_t th;

	/* Phase 1: before the tracer. */
	expect(cudaSetDevice(1), 0, "cudaSetDevice(1)");
	expect(cudaMalloc(&a, 1u << 20), 0, "cudaMalloc a");
	expect(cudaMalloc(&b, 2u << 20), 0, "cudaMalloc b");
	expect(cudaMallocHost(&h, 64u << 10), 0, "cudaMallocHost h");
	expect(cudaMallocManaged(&m, 3u << 20, cudaMemAttachGlobal), 0, "cudaMallocManaged m");
	expect(cudaSetDevice(0), 0, "cudaSetDevice(0)");
	expect(cudaMalloc(&c, 512u << 10), 0, "cudaMalloc c");
	expect(cudaFree(b), 0, "cudaFree b");

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin)) {
		fprintf(stderr, "attach_later: stdin closed before the go line\n");
		return 2;
	}

	/* Phase 2: traced. */
	fakecuda_log_marker("PHASE2");
	expect(cudaSetDevice(1), 0, "cudaSetDevice(1)");
	expect(cudaMalloc(&p1, 4u << 20), 0, "cudaMalloc p1");
	expect(cudaMallocAsync(&p2, 5u << 20, (cudaStream_t)0), 0, "cudaMallocAsync p2");
	expect(cudaFree(a), 0, "cudaFree a (phase 1)");
	expect(cudaFree(p1), 0, "cudaFree p1");
	/* Lands where a or p1 was: an address reused across the attach. */
	expect(cudaMallocPitch(&p3, &pitch, 1000, 100), 0, "cudaMallocPitch p3");
	expect(cudaSetDevice(0), 0, "cudaSetDevice(0)");
	expect(cudaMalloc(&p4, 6u << 20), 0, "cudaMalloc p4");
	expect(cudaFreeHost(h), 0, "cudaFreeHost h (phase 1)");
	expect(cudaHostAlloc(&h2, 128u << 10, cudaHostAllocDefault), 0, "cudaHostAlloc h2");
	expect(cudaMallocManaged(&m2, 1u << 20, cudaMemAttachGlobal), 0, "cudaMallocManaged m2");
	expect(cudaMalloc(&x, 0), cudaErrorInvalidValue, "cudaMalloc(0)");
	expect(cudaMalloc(&x, (size_t)1 << 40), cudaErrorMemoryAllocation, "cudaMalloc(1 TiB)");
	expect(cudaSetDevice(7), cudaErrorInvalidDevice, "cudaSetDevice(7)");
	if (pthread_create(&th, NULL, late_thread, NULL) != 0) {
		perror("pthread_create");
		return 2;
	}
	pthread_join(th, NULL);
	expect(cudaFree(c), 0, "cudaFree c (phase 1)");
	expect(cudaFree(p4), 0, "cudaFree p4");
	expect(cudaFree(m), 0, "cudaFree m (phase 1)");
	(void)p2; /* p2, p3, h2, m2 and the thread's first buffer stay live */
	return bad ? 3 : 0;
}
