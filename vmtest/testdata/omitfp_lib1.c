// An -O2 -fomit-frame-pointer call chain that crosses two shared
// libraries and back before allocating (vmtest/unwind_test.go):
// main -> lib1_outer -> lib2_middle -> lib2_hidden (static) -> lib1_inner
// -> cudaMalloc. Nothing on the way keeps a frame-pointer chain.
#include <stddef.h>

extern int cudaMalloc(void **ptr, size_t size);
extern int lib2_middle(int depth);

volatile int lib1_sink;

__attribute__((noinline)) int lib1_inner(int depth)
{
	void *p = NULL;
	int r = cudaMalloc(&p, (size_t)depth << 20); // LINE:lib1_inner
	lib1_sink += r + (p != NULL);
	return r + 1;
}

__attribute__((noinline)) int lib1_outer(int depth)
{
	int r = lib2_middle(depth + 1); // LINE:lib1_outer
	lib1_sink += r;
	return r * 3;
}
