/*
 * rankjob: one rank of a stand-in distributed training job, on the
 * stand-in libcudart. It takes its rank from the environment as the
 * frameworks do (RANK, else OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID;
 * exits 2 with none), allocates on device 0 a block of (rank+1) MiB and
 * another of rank*64 KiB + 512 bytes, frees a third it made between them
 * (so that its peak is above what it ends with), and writes DIR/ready.R
 * holding "PID" (written to a temporary name, then renamed).
 *
 *   rankjob DIR [FAIL...]
 *
 * It then waits until DIR/go.R exists. A rank listed in FAIL calls
 * oom_here(): a cudaMalloc larger than the stand-in's device, which
 * fails with cudaErrorMemoryAllocation, between two readings of the wall
 * clock it writes to DIR/oom.R ("BEFORE AFTER", ns since the epoch).
 * Every rank then exits 0 (3 when a call returned what it should not),
 * holding its two blocks: what it held at exit. Its ground truth is the
 * stand-in's log.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_decls.h"

static int bad;

static void expect(int got, int want, const char *what)
{
	if (got != want) {
		fprintf(stderr, "rankjob: %s returned %d, want %d\n", what, got, want);
		bad++;
	}
}

static int rank_from_env(void)
{
	const char *names[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *v = getenv(names[i]);
		if (v && *v)
			return atoi(v);
	}
	return -1;
}

static long long wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void put(const char *dir, const char *name, int rank, const char *text)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/%s.%d", dir, name, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
		perror(path);
		exit(2);
	}
}

/* The allocation that runs out: the stack the report names. */
__attribute__((noinline)) static int oom_here(void)
{
	void *p = NULL;
	return cudaMalloc(&p, (size_t)64 << 30);
}

__attribute__((noinline)) static void *rank_alloc(size_t n)
{
	void *p = NULL;
	expect(cudaMalloc(&p, n), 0, "cudaMalloc");
	return p;
}

int main(int argc, char **argv)
{
	char text[128], path[4096];
	int rank = rank_from_env();
	if (argc < 2 || rank < 0) {
		fprintf(stderr, "usage: RANK=N rankjob DIR [FAIL...]\n");
		return 2;
	}
	const char *dir = argv[1];
	int fail = 0;
	for (int i = 2; i < argc; i++)
		fail |= atoi(argv[i]) == rank;

	expect(cudaSetDevice(0), 0, "cudaSetDevice(0)");
	rank_alloc(((size_t)rank + 1) << 20);
	void *t = rank_alloc(2u << 20);
	rank_alloc((size_t)rank * (64u << 10) + 512);
	expect(cudaFree(t), 0, "cudaFree");
	snprintf(text, sizeof(text), "%d\n", (int)getpid());
	put(dir, "ready", rank, text);

	snprintf(path, sizeof(path), "%s/go.%d", dir, rank);
	for (int i = 0; access(path, F_OK) != 0; i++) {
		if (i > 6000) { /* 60 s */
			fprintf(stderr, "rankjob: rank %d: no %s\n", rank, path);
			return 2;
		}
		usleep(10000);
	}
	if (fail) {
		long long before = wall_ns();
		expect(oom_here(), 2, "cudaMalloc of 64 GiB");
		long long after = wall_ns();
		snprintf(text, sizeof(text), "%lld %lld\n", before, after);
		put(dir, "oom", rank, text);
	}
	return bad ? 3 : 0;
}
