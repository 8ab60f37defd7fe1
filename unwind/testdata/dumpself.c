// The executable of the unwind tests' chain. chain_leaf records what the
// BPF side would at a probe in it: rip, rsp and rbp, the stack bytes from
// rsp up (at most 16 KiB, less at the top of the stack) and the process's
// mappings, into the file named by argv[1]. Built -O2
// -fomit-frame-pointer: rbp holds no frame chain anywhere on the way.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int lib1_outer(int depth);

static const char *out;
volatile int main_sink;

static uint64_t stack_end(uint64_t sp)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	uint64_t end = sp;
	while (f && fgets(line, sizeof(line), f)) {
		uint64_t lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && sp >= lo && sp < hi)
			end = hi;
	}
	if (f)
		fclose(f);
	return end;
}

__attribute__((noinline)) int chain_leaf(int depth)
{
	uint64_t ip, sp, bp;
	__asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
	static unsigned char win[16384];
	uint64_t n = stack_end(sp) - sp;
	if (n > sizeof(win))
		n = sizeof(win);
	memcpy(win, (void *)sp, n);
	FILE *f = fopen(out, "w");
	if (!f)
		exit(2);
	fprintf(f, "%lx %lx %lx %lu\n", ip, sp, bp, n);
	fwrite(win, 1, n, f);
	FILE *m = fopen("/proc/self/maps", "r");
	char buf[4096];
	size_t k;
	while (m && (k = fread(buf, 1, sizeof(buf), m)) > 0)
		fwrite(buf, 1, k, f);
	if (m)
		fclose(m);
	fclose(f);
	return depth;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	out = argv[1];
	int r = lib1_outer(argc); // LINE:main
	main_sink += r;
	return 0;
}
