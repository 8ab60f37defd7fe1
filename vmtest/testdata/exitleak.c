/*
 * exitleak: leaks GPU memory on two devices and ends with its group
 * leader gone first. main allocates on devices 0 and 1 (and frees one
 * block), says "ready", waits for a line or the end of stdin, starts a
 * worker and leaves with pthread_exit. The worker waits until the leader
 * has exited, allocates once more on each device, prints what the process
 * leaks per device ("leak device=D allocs=N bytes=B") and returns: the
 * process ends with it. A tracer that took the leader's exit for the
 * process's would miss the worker's allocations in what was held at exit.
 * Exits non-zero when a call fails.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_decls.h"
#include "procstat.h"

static pid_t leader;
static int bad;
static size_t leaked[2], count[2];

static void take(int dev, size_t size, int keep)
{
	void *p = NULL;
	bad |= cudaSetDevice(dev) != 0;
	bad |= cudaMalloc(&p, size) != 0;
	if (keep) {
		leaked[dev] += size;
		count[dev]++;
	} else {
		bad |= cudaFree(p) != 0;
	}
}

/* leader_gone: the leader's thread is a zombie (its exit done). */
static int leader_gone(void)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)leader);
	if (!read_stat(path, buf, sizeof(buf)))
		return 1;
	char *end = strrchr(buf, ')');
	return end && end[1] == ' ' && end[2] == 'Z';
}

static void *worker(void *arg)
{
	(void)arg;
	for (int i = 0; i < 500 && !leader_gone(); i++)
		usleep(10000);
	if (!leader_gone())
		bad = 1;
	take(1, 12288, 1);
	take(0, 8192, 1);
	for (int d = 0; d < 2; d++)
		printf("leak device=%d allocs=%zu bytes=%zu\n", d, count[d], leaked[d]);
	if (bad)
		fprintf(stderr, "exitleak: a call failed\n");
	fflush(stdout);
	if (bad)
		_exit(3);
	return NULL;
}

int main(void)
{
	leader = getpid();
	take(0, 1 << 20, 1);
	take(0, 65536, 0);
	take(1, 2 << 20, 1);
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin)) {
		/* end of stdin: go on */
	}
	pthread_t t;
	if (pthread_create(&t, NULL, worker, NULL))
		return 3;
	pthread_exit(NULL);
}
