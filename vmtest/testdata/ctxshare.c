/*
 * ctxshare: two processes holding the same context handle for different
 * contexts. The stand-in driver hands out created contexts from a fixed
 * arena (its first is the same value in every process), as a real driver's
 * heap pointers are in ranks of one program run with address randomization
 * off. The child makes its context on device 1 and the parent then makes
 * its own, the same handle, on device 0; then:
 *   - the child makes its context current again and allocates 1 MiB: on
 *     device 1 (a tracer keying contexts by handle alone would take the
 *     parent's device 0);
 *   - the child attaches its context (usage count 2), the parent allocates
 *     2 MiB in its own and destroys it (freed with it), and the child
 *     detaches once: its context lives on (count 1), its 1 MiB live at exit
 *     (a tracer that let the parent's destroy end the child's usage count
 *     would free the child's 1 MiB with it).
 * Linked with the stand-in libcuda.so.1. Exits non-zero when a call that
 * should succeed fails, or the stand-in's handles differ (the test would
 * prove nothing).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_decls.h"
#include "cuda_check.h"

#define MiB (1ULL << 20)

__attribute__((noinline)) static CUdeviceptr share_alloc(size_t n)
{
	CUdeviceptr p = 0;
	CHECK(cuMemAlloc_v2(&p, n));
	return p;
}

static void put(int fd, uint64_t v)
{
	if (write(fd, &v, sizeof(v)) != sizeof(v))
		bad++;
}

static uint64_t take(int fd)
{
	uint64_t v = 0;
	if (read(fd, &v, sizeof(v)) != sizeof(v))
		bad++;
	return v;
}

int main(void)
{
	int to_child[2], to_parent[2];
	CHECK(cuInit(0));
	if (pipe(to_child) || pipe(to_parent))
		return 2;
	pid_t pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		CUcontext c, again;
		CHECK(cuCtxCreate_v2(&c, 0, 1));
		put(to_parent[1], (uint64_t)(uintptr_t)c);
		take(to_child[0]); /* the parent made its context */
		CHECK(cuCtxSetCurrent(c));
		share_alloc(1 * MiB);
		CHECK(cuCtxAttach(&again, 0));
		put(to_parent[1], 0);
		take(to_child[0]); /* the parent destroyed its context */
		CHECK(cuCtxDetach(c));
		_exit(bad ? 1 : 0);
	}
	CUcontext p;
	uint64_t theirs = take(to_parent[0]);
	CHECK(cuCtxCreate_v2(&p, 0, 0));
	if ((uint64_t)(uintptr_t)p != theirs) {
		fprintf(stderr, "ctxshare: handles %#llx and %#llx differ\n", (unsigned long long)(uintptr_t)p,
			(unsigned long long)theirs);
		bad++;
	}
	put(to_child[1], 0);
	take(to_parent[0]); /* the child allocated and attached */
	share_alloc(2 * MiB);
	CHECK(cuCtxDestroy_v2(p));
	put(to_child[1], 0);
	int st = 0;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		bad++;
	return bad ? 1 : 0;
}
