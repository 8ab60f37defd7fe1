// What the unwind tests' chain records at its probe (dumpself.c,
// arm64/dumpself.c), into the file out: a line of the registers (regs)
// and the window's length, the stack bytes from sp up (at most 16 KiB,
// less at the top of the stack), then the process's mappings.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static void dump(const char *out, const char *regs, uint64_t sp)
{
	static unsigned char win[16384];
	uint64_t n = stack_end(sp) - sp;
	if (n > sizeof(win))
		n = sizeof(win);
	memcpy(win, (void *)sp, n);
	FILE *f = fopen(out, "w");
	if (!f)
		exit(2);
	fprintf(f, "%s %lu\n", regs, n);
	fwrite(win, 1, n, f);
	FILE *m = fopen("/proc/self/maps", "r");
	char buf[4096];
	size_t k;
	while (m && (k = fread(buf, 1, sizeof(buf), m)) > 0)
		fwrite(buf, 1, k, f);
	if (m)
		fclose(m);
	fclose(f);
}
