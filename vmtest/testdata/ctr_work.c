// A library built twice for one path (vmtest/container_test.go): the
// host's copy (-DHOST) and a container's, whose allocating function has
// another name, line, address and frame. Both are built -O2
// -fomit-frame-pointer -g: a stack through them unwinds only with the CFI
// of the copy that ran, and names only from it.
#include <stddef.h>

extern int cudaMalloc(void **ptr, size_t size);

volatile int work_sink;

#ifdef HOST
__attribute__((noinline)) int host_alloc(size_t n)
{
	void *p = NULL;
	int r = cudaMalloc(&p, n); // LINE:host_alloc
	work_sink += r + (p != NULL);
	return r + 1;
}
#define ALLOC host_alloc
#else
// Code ahead of the container's functions: they land at other addresses.
__attribute__((noinline)) int container_pad(int x)
{
	for (int i = 0; i < x; i++)
		work_sink += i * x ^ (work_sink >> 3);
	return work_sink;
}

__attribute__((noinline)) int container_alloc(size_t n)
{
	volatile char scratch[200]; // a larger frame than the host's copy
	void *p = NULL;
	scratch[n % 200] = 1;
	int r = cudaMalloc(&p, n); // LINE:container_alloc
	work_sink += r + (p != NULL) + scratch[0];
	return r + 1;
}
#define ALLOC container_alloc
#endif

__attribute__((noinline)) int work(int depth)
{
	int r = ALLOC((size_t)depth << 20); // LINE:work
	work_sink += r;
	return r * 3;
}
