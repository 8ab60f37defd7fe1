/*
 * A simulated training job for `make demo`. It calls the CUDA runtime API the
 * way a small training loop does, against the stand-in libcudart built from
 * vmtest/testdata/fakecudart.c: there is no GPU, but every call is a real
 * call into a real shared library, and cudatrace traces it with the same
 * uprobes it puts on NVIDIA's libcudart.
 *
 * The story the trace tells: weights and optimizer state are allocated once,
 * each step allocates and frees its activations, a metrics cache leaks one
 * buffer per step, pinned host memory stages the batches, and a last "eval
 * with a bigger batch" runs out of memory (cudaErrorMemoryAllocation).
 *
 * `train [WEIGHTS_MiB]` loads weights of that size (512 MiB by default): two
 * runs of different sizes are what `cudatrace diff` compares in vmtest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cuda_decls.h"

#define MiB (1024UL * 1024UL)

static void *cuda_alloc(size_t n)
{
	void *p = NULL;
	cudaError_t err = cudaMalloc(&p, n);

	if (err != 0) {
		fprintf(stderr, "train: cudaMalloc(%zu MiB) failed: error %d (out of memory)\n", n / MiB, err);
		return NULL;
	}
	return p;
}

static void *load_weights(size_t n) { return cuda_alloc(n); }

static void *init_optimizer_state(size_t n)
{
	void *p = NULL;

	if (cudaMallocManaged(&p, n, cudaMemAttachGlobal) != 0)
		return NULL;
	return p;
}

static void *record_metrics(size_t n) { return cuda_alloc(n); } /* never freed: the leak */

static int forward_backward(size_t act)
{
	void *a = cuda_alloc(act);
	void *g = cuda_alloc(act / 2); /* runs even when a failed ... */

	if (!a || !g)
		return -1; /* ... and is never freed then: a leak on the error path */
	usleep(20 * 1000); /* "compute" */
	cudaFree(g);
	cudaFree(a);
	return 0;
}

static int train_step(void *staging, size_t act)
{
	(void)staging; /* the batch would be copied from here */
	record_metrics(4 * MiB);
	return forward_backward(act);
}

static int evaluate(size_t act) { return forward_backward(act); }

int main(int argc, char **argv)
{
	size_t weights_mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 512;
	void *weights = load_weights(weights_mib * MiB);
	void *opt = init_optimizer_state(256 * MiB);
	void *staging = NULL;

	if (!weights || !opt || cudaMallocHost(&staging, 64 * MiB) != 0)
		return 1;
	for (int step = 0; step < 25; step++) {
		if (train_step(staging, 128 * MiB) != 0)
			return 1;
	}
	printf("train: 25 steps done; evaluating with a 4x batch\n");
	if (evaluate(512 * MiB) != 0)
		printf("train: evaluation ran out of GPU memory\n");
	cudaFreeHost(staging);
	cudaFree(opt);
	return 0; /* weights and the metrics cache are still allocated */
}
