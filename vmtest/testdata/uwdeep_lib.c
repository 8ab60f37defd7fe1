// Two libraries built from this file without frame pointers (-DSIDE=a,
// -DSIDE=b): a recursion that alternates between them through their PLTs,
// with alloca and a tail call on the way, down to one cudaMalloc and its
// cudaFree (vmtest/unwind_bpf_test.go: BPF's unwind against the window's).
#include <alloca.h>
#include <stddef.h>

extern int cudaMalloc(void **ptr, size_t size);
extern int cudaFree(void *ptr);

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define SELF CAT(uw_, SIDE)
#if SIDE == 1
#define OTHER uw_2
#else
#define OTHER uw_1
#endif

int OTHER(int depth);

// leaf allocates once, and frees.
__attribute__((noinline)) int CAT(leaf_, SIDE)(void)
{
	void *p = NULL;
	int r = cudaMalloc(&p, 1 << 20);
	if (r == 0)
		r = cudaFree(p);
	return r;
}

// tail goes on to the other library as a tail call: its frame is gone
// from the stack when the allocation is made.
__attribute__((noinline)) int CAT(tail_, SIDE)(int depth)
{
	return OTHER(depth);
}

int SELF(int depth)
{
	if (depth <= 0)
		return CAT(leaf_, SIDE)();
	// A frame whose size is known only at run time: its CFA is rbp's.
	char *buf = alloca(16 + (depth & 7) * 16);
	buf[0] = (char)depth;
	__asm__ volatile("" ::"r"(buf) : "memory");
	int r = depth % 10 == 3 ? CAT(tail_, SIDE)(depth - 1) : OTHER(depth - 1);
	__asm__ volatile("" ::"r"(buf) : "memory");
	return r + buf[0] - (char)depth;
}
