/*
 * soakjob: the soak's native CUDA jobs (vmtest/soak_test.go), on the
 * runtime stand-in, run by the thousand. Each exits without freeing what
 * it holds (what a tracer keeps of it must go with it).
 *
 *   soakjob hold      allocates on devices 0 and 1 and pinned host memory,
 *                     frees one block, exits holding the rest
 *   soakjob mid       a second thread allocates and frees in a loop; once
 *                     it has made one allocation the process leaves with
 *                     _exit, the thread (nearly always) inside a call
 *   soakjob renamed   renames itself (prctl and its argv, as setproctitle
 *                     does), allocates, forks a worker that renames itself
 *                     again and allocates (no exec), waits for it and exits
 *
 * Exits 0, or 3 when a call returned what it should not.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_decls.h"

static int bad;

__attribute__((noinline)) static void *soak_alloc(size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n) != 0)
		bad = 1;
	return p;
}

static atomic_int allocated;

static void *churn(void *arg)
{
	(void)arg;
	for (;;) {
		void *p = soak_alloc(64u << 10);
		atomic_store(&allocated, 1);
		cudaFree(p);
	}
	return NULL;
}

/* rename: the comm and the command line, as setproctitle does. */
static void rename_to(char *argv0, size_t room, const char *name)
{
	prctl(PR_SET_NAME, name, 0, 0, 0);
	memset(argv0, 0, room);
	strncpy(argv0, name, room - 1);
}

int main(int argc, char **argv)
{
	size_t salt = (size_t)(getpid() % 64) * 4096;
	if (argc < 2)
		return 2;
	if (!strcmp(argv[1], "hold")) {
		void *a, *h = NULL;
		a = soak_alloc((1u << 20) + salt);
		soak_alloc(3u << 20);
		if (cudaSetDevice(1) != 0 || cudaMallocHost(&h, 8192) != 0)
			bad = 1;
		soak_alloc((2u << 20) + salt);
		if (cudaFree(a) != 0)
			bad = 1;
		return bad ? 3 : 0;
	}
	if (!strcmp(argv[1], "mid")) {
		pthread_t t;
		if (pthread_create(&t, NULL, churn, NULL) != 0)
			return 3;
		while (!atomic_load(&allocated))
			sched_yield();
		_exit(bad ? 3 : 0);
	}
	if (!strcmp(argv[1], "renamed")) {
		/* The whole argv area is the process's to rewrite. */
		size_t room = (size_t)(argv[argc - 1] + strlen(argv[argc - 1]) - argv[0]) + 1;
		rename_to(argv[0], room, "soak-worker");
		soak_alloc((1u << 20) + salt);
		pid_t c = fork();
		if (c == 0) {
			rename_to(argv[0], room, "soak-child");
			soak_alloc(2u << 20);
			_exit(bad ? 3 : 0);
		}
		int st = 0;
		if (c < 0 || waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bad = 1;
		return bad ? 3 : 0;
	}
	return 2;
}
