/*
 * dlopen_late LIB N: loads a CUDA runtime with dlopen() one second
 * (DLOPEN_LATE_DELAY_MS) after starting (a wheel's copy, at a path no start-up search covers), gives the
 * tracer 1.5 s (DLOPEN_LATE_WAIT_MS) to find it in its mappings, then makes N cudaMalloc of
 * 4096+i bytes and frees the even ones. Exits 2 when LIB cannot be used.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	int n = atoi(argv[2]);
	const char *delay = getenv("DLOPEN_LATE_DELAY_MS");
	usleep(delay && *delay ? (useconds_t)atoi(delay) * 1000 : 1000000);
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen_late: %s\n", dlerror());
		return 2;
	}
	malloc_fn m = (malloc_fn)dlsym(h, "cudaMalloc");
	free_fn f = (free_fn)dlsym(h, "cudaFree");
	if (!m || !f)
		return 2;
	const char *wait = getenv("DLOPEN_LATE_WAIT_MS");
	usleep(wait && *wait ? (useconds_t)atoi(wait) * 1000 : 1500000);
	for (int i = 0; i < n; i++) {
		void *p = NULL;
		if (m(&p, 4096 + (size_t)i) != 0)
			return 3;
		if (i % 2 == 0 && f(p) != 0)
			return 3;
	}
	usleep(300000); /* mappings still readable when the first event arrives */
	printf("dlopen_late: n=%d\n", n);
	return 0;
}
