/*
 * agentload: a long-running job for the agent's tests. It takes commands,
 * one per line on stdin, and answers each with "ok" on stdout once done:
 *   weights N DEV   cudaMalloc N bytes on device DEV from load_weights()
 *   step N          cudaMalloc N bytes on the current device from
 *                   train_step(), then cudaFree it (a transient allocation)
 *   steps K N       K such steps (pausing 1 ms every 100, so that a tracer
 *                   reading the records keeps up)
 *   die 0           SIGKILL itself (no answer), as a job killed after an OOM
 *   grow N          cudaMalloc N bytes from grow_activations(): with N over
 *                   FAKECUDA_MEM_LIMIT it fails with cudaErrorMemoryAllocation
 *                   (answered "oom", else "ok")
 * and exits at the end of its input without freeing what it holds. Every
 * call goes through the stand-in, which logs the ground truth.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_decls.h"

__attribute__((noinline)) static int load_weights(size_t n, int dev)
{
	void *p = NULL;
	if (cudaSetDevice(dev) != 0)
		return 1;
	return cudaMalloc(&p, n) != 0;
}

__attribute__((noinline)) static int train_step(size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n) != 0)
		return 1;
	return cudaFree(p) != 0;
}

__attribute__((noinline)) static int grow_activations(size_t n)
{
	void *p = NULL;
	return cudaMalloc(&p, n);
}

int main(void)
{
	char line[128], cmd[32];
	unsigned long long n;
	int dev;

	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		dev = 0;
		if (sscanf(line, "%31s %llu %d", cmd, &n, &dev) < 2) {
			fprintf(stderr, "agentload: bad command %s", line);
			return 2;
		}
		if (strcmp(cmd, "weights") == 0) {
			if (load_weights(n, dev)) {
				fprintf(stderr, "agentload: load_weights failed\n");
				return 3;
			}
			printf("ok\n");
		} else if (strcmp(cmd, "step") == 0) {
			if (train_step(n)) {
				fprintf(stderr, "agentload: train_step failed\n");
				return 3;
			}
			printf("ok\n");
		} else if (strcmp(cmd, "steps") == 0) {
			for (int i = 0; i < (int)n; i++) {
				if (train_step((size_t)dev)) {
					fprintf(stderr, "agentload: train_step failed\n");
					return 3;
				}
				if (i % 100 == 99)
					usleep(1000);
			}
			printf("ok\n");
		} else if (strcmp(cmd, "die") == 0) {
			kill(getpid(), SIGKILL);
		} else if (strcmp(cmd, "grow") == 0) {
			int r = grow_activations(n);
			printf("%s\n", r == cudaErrorMemoryAllocation ? "oom" : r == 0 ? "ok" : "error");
		} else {
			fprintf(stderr, "agentload: unknown command %s\n", cmd);
			return 2;
		}
	}
	return 0;
}
