/* Shared library fixture: built -O2 -g -fPIC -shared by the tests. */
#include <stdlib.h>
#include <string.h>

static __attribute__((noinline)) void *static_helper(size_t n)
{
	void *p = malloc(n);
	if (p)
		memset(p, 0x5a, n);
	return p;
}

void *lib_alloc(size_t n)
{
	void *p = static_helper(n * 2);
	if (!p)
		abort();
	return p;
}

void *lib_static_addr(void)
{
	return (void *)&static_helper;
}

/* Exported under a symbol version, so its .symtab name carries "@@". */
void *lib_versioned_impl(size_t n)
{
	void *p = calloc(n, 3);
	if (!p)
		abort();
	return p;
}
__asm__(".symver lib_versioned_impl, lib_versioned@@LIBDEMO_1.0");
