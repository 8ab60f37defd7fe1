// uwmemo ROUNDS: allocations from one place (leaf) at one stack depth
// through two call chains, main < by_a < leaf and main < mid < by_b <
// leaf, whose frames above leaf's take the same room (48 bytes: by_a's,
// against mid's 16 and by_b's 32): ROUNDS through by_a, ROUNDS through
// by_b, ROUNDS through by_a again, a millisecond apart. Built without
// frame pointers (vmtest/unwind_bpf_test.go TestUnwindMemo): BPF keeps
// each stack it unwinds by where its unwind starts (pc and sp, the same
// here for every allocation) with the words it read; a stack through the
// other chain starts there too, and must not be taken from it (its
// return address to main is where by_a's was: only the word before it
// tells the chains apart).
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "uwleaf.h"

// Not tail calls: each keeps its frame, of the size its buffer gives it
// (the ABI keeps a frame, its return address in, a multiple of 16).
__attribute__((noinline)) int by_a(void)
{
	volatile char buf[32];
	buf[0] = 1;
	int r = leaf();
	return r + buf[0] - 1;
}

__attribute__((noinline)) int by_b(void)
{
	volatile char buf[16];
	buf[0] = 1;
	int r = leaf();
	return r + buf[0] - 1;
}

__attribute__((noinline)) int mid(void)
{
	int r = by_b();
	__asm__ volatile("" ::: "memory");
	return r * 3;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 100;
	for (int pass = 0; pass < 3; pass++) {
		for (int i = 0; i < rounds; i++) {
			if ((pass == 1 ? mid() : by_a()) != 0)
				return 1;
			usleep(1000);
		}
	}
	return 0;
}
