// The executable of the unwind tests' chain. chain_leaf records what the
// BPF side would at a probe in it: rip, rsp and rbp, the stack bytes from
// rsp up (at most 16 KiB, less at the top of the stack) and the process's
// mappings, into the file named by argv[1]. Built -O2
// -fomit-frame-pointer: rbp holds no frame chain anywhere on the way.
#include "dump.h"

extern int lib1_outer(int depth);

static const char *out;
volatile int main_sink;

__attribute__((noinline)) int chain_leaf(int depth)
{
	uint64_t ip, sp, bp;
	__asm__ volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
	char regs[64];
	snprintf(regs, sizeof(regs), "%lx %lx %lx", ip, sp, bp);
	dump(out, regs, sp);
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
