// 41 frames of an -O2 -fomit-frame-pointer recursion, ~1 KiB each, above
// one cudaMalloc (vmtest/unwind_test.go): deeper than a 16 KiB stack
// window reaches, within 64 KiB.
#include <stddef.h>

extern int cudaMalloc(void **ptr, size_t size);

__attribute__((noinline)) int recurse(int depth)
{
	volatile char pad[900];
	pad[0] = (char)depth;
	if (depth == 0) {
		void *p = NULL;
		return cudaMalloc(&p, 1 << 20) + pad[0];
	}
	return recurse(depth - 1) + pad[0];
}

int main(void)
{
	return recurse(40) > 1000;
}
