/*
 * leaf: the one place uwmemo.c and uwwide.c allocate from, a function of
 * its own (never inlined: its name is the innermost frame the tests look
 * for), for programs built without frame pointers.
 */
#ifndef CUDATRACE_VMTEST_UWLEAF_H
#define CUDATRACE_VMTEST_UWLEAF_H

#include <stddef.h>

extern int cudaMalloc(void **ptr, size_t size);
extern int cudaFree(void *ptr);

__attribute__((noinline)) int leaf(void)
{
	void *p = NULL;
	int r = cudaMalloc(&p, 1 << 20);
	if (r == 0)
		r = cudaFree(p);
	return r;
}

#endif
