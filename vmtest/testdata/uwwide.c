// uwwide ROUNDS: ROUNDS allocations from one place through a stack of
// ~110 KiB, built without frame pointers (vmtest/unwind_bpf_test.go
// TestUnwindMemoWide): main < wide x12 < holed < leaf. Each wide frame
// holds 9 KiB, so that the words BPF's memo checks lie further apart than
// one of its spans holds (8 KiB), and there are more of them than it keeps
// spans (8): the last are read with their pages. holed's frame holds
// almost 8 KiB, one page of which it gives back to the kernel
// (MADV_DONTNEED) before each call down: the span between its return
// address and leaf's then has a page not present, whose read fails in
// BPF (no read there faults a page in), and its words are read with
// their own pages.
#include <alloca.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "uwleaf.h"

#define WIDE 12

// dry: holed says whether a page would lie whole inside its buffer
// (fits), and allocates nothing. Where it would not, main moves the stack
// down and asks again: the stack's top is random to 16 bytes, and one run
// in sixteen would otherwise have no hole.
static int dry, fits;

__attribute__((noinline)) int holed(void)
{
	volatile char buf[7936];
	buf[0] = 1;
	buf[sizeof(buf) - 1] = 1;
	uintptr_t page = ((uintptr_t)buf + 4095) & ~(uintptr_t)4095;
	int whole = page + 4096 <= (uintptr_t)buf + sizeof(buf) - 1;
	if (dry) {
		fits = whole;
		return 0;
	}
	if (whole && madvise((void *)page, 4096, MADV_DONTNEED) != 0)
		return 3;
	int r = leaf();
	return r + buf[0] - 1;
}

__attribute__((noinline)) int wide(int depth)
{
	volatile char buf[9216];
	buf[0] = (char)depth;
	buf[sizeof(buf) - 1] = 1;
	int r = depth > 1 ? wide(depth - 1) : holed();
	return r + buf[0] - (char)depth;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 100;
	dry = 1;
	for (int tries = 0; wide(WIDE) == 0 && !fits; tries++) {
		if (tries == 64)
			return 4;
		volatile char *pad = alloca(128);
		pad[0] = 0;
	}
	dry = 0;
	for (int i = 0; i < rounds; i++) {
		if (wide(WIDE) != 0)
			return 2;
		// The rules for its files are asked for at its first record and
		// come while it waits here: under load they once took longer
		// than all the rounds, 1 ms apart.
		usleep(i == 0 ? 300000 : 1000);
	}
	return 0;
}
