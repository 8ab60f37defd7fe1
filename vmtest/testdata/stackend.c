/*
 * stackend: one cudaMalloc on the main thread, then one on a thread it
 * starts, each from a function built without frame pointers. Before
 * each it prints where its thread's stack ends, as BPF bounds the stack
 * window there: the stack pointer the program was entered with (field 28
 * of /proc/self/stat, start_stack) for the main thread, the thread
 * pointer (fsbase) for the thread, below which glibc puts its stack:
 *   stackend: WHO tid=T fsbase=0x... start_stack=0x...
 * Exits non-zero when a call fails.
 */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_decls.h"
#include "procstat.h"

static unsigned long fsbase(void)
{
	unsigned long fs = 0;
	syscall(SYS_arch_prctl, ARCH_GET_FS, &fs);
	return fs;
}

/* start_stack: field 28 of /proc/self/stat, counted after the command's
 * closing parenthesis (field 2 may hold spaces). */
static unsigned long start_stack(void)
{
	char buf[1024];
	if (!read_stat("/proc/self/stat", buf, sizeof(buf)))
		return 0;
	char *p = strrchr(buf, ')');
	unsigned long v = 0;
	for (int field = 3; p && field <= 28; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 28)
			sscanf(p + 1, "%lu", &v);
	}
	return v;
}

__attribute__((noinline)) static int take(const char *who)
{
	void *p = NULL;
	printf("stackend: %s tid=%ld fsbase=%#lx start_stack=%#lx\n", who, (long)syscall(SYS_gettid), fsbase(),
	       start_stack());
	fflush(stdout);
	if (cudaMalloc(&p, 4096) != 0) /* LINE:take */
		return 1;
	return cudaFree(p) != 0;
}

static void *worker(void *arg)
{
	(void)arg;
	return (void *)(long)take("thread");
}

int main(void)
{
	pthread_t t;
	void *bad = NULL;
	if (take("main") != 0 || pthread_create(&t, NULL, worker, NULL) != 0 || pthread_join(t, &bad) != 0)
		return 1;
	return bad != NULL;
}
