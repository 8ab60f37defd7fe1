/*
 * Executable fixture: prints the addresses of one of its own functions and
 * of library functions, then blocks on stdin so the test can read its maps.
 * With arguments LIB SYM..., it also dlopens LIB and prints dlsym(SYM).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

void *lib_alloc(size_t n);
void *lib_static_addr(void);
void *lib_versioned(size_t n);

int exe_work(int x)
{
	int y = x * 3;
	printf("%d\n", y);
	return y + 1;
}

int main(int argc, char **argv)
{
	printf("%p %p %p %p", (void *)&exe_work, (void *)&lib_alloc,
	       lib_static_addr(), (void *)&lib_versioned);
	if (argc > 2) {
		void *h = dlopen(argv[1], RTLD_NOW);
		if (!h) {
			fprintf(stderr, "%s\n", dlerror());
			return 1;
		}
		for (int i = 2; i < argc; i++)
			printf(" %p", dlsym(h, argv[i]));
	}
	printf("\n");
	fflush(stdout);
	getchar();
	return 0;
}
