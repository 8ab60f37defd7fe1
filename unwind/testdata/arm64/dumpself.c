// The arm64 executable of the unwind tests' chain (../chain_lib1.c,
// ../chain_lib2.c): chain_leaf records what a BPF probe would see inside
// ct_snap, a leaf that signs its return address as
// -mbranch-protection=standard code does: pc, sp, x29 and the signed x30
// (the link register), the stack bytes from sp up (at most 16 KiB, less at
// the top of the stack) and the process's mappings, into the file named
// by argv[1]. Built as README.md says: -O2 -fomit-frame-pointer, so x29
// holds no frame chain, and with pointer authentication, so the return
// addresses the chain saves carry its codes.
#include "../dump.h"

extern int lib1_outer(int depth);

struct snap {
	uint64_t pc, sp, fp, lr;
};

// ct_snap(struct snap *s) stores the registers at its label 1: after
// paciasp, as at a probe in the body of a function that signed x30 and
// has not saved it (its CFI: the CFA is sp, x30 holds the return address).
void ct_snap(struct snap *s);
__asm__(".text\n"
	".globl ct_snap\n"
	".type ct_snap, %function\n"
	"ct_snap:\n"
	".cfi_startproc\n"
	"	paciasp\n"
	".cfi_negate_ra_state\n"
	"1:	adr x1, 1b\n"
	"	str x1, [x0]\n"
	"	mov x1, sp\n"
	"	str x1, [x0, 8]\n"
	"	str x29, [x0, 16]\n"
	"	str x30, [x0, 24]\n"
	"	autiasp\n"
	".cfi_negate_ra_state\n"
	"	ret\n"
	".cfi_endproc\n"
	".size ct_snap, .-ct_snap\n");

static const char *out;
volatile int main_sink;

__attribute__((noinline)) int chain_leaf(int depth)
{
	struct snap s;
	ct_snap(&s); // LINE:chain_leaf
	char regs[80];
	snprintf(regs, sizeof(regs), "%lx %lx %lx %lx", s.pc, s.sp, s.fp, s.lr);
	dump(out, regs, s.sp);
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
