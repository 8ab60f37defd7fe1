// The second library of the chain in omitfp_lib1.c. lib2_hidden is
// static: only .symtab (or MiniDebugInfo) names it, not .dynsym.
extern int lib1_inner(int depth);

volatile int lib2_sink;

static __attribute__((noinline)) int lib2_hidden(int depth)
{
	char buf[200]; // a frame of its own, sized unlike its neighbours'
	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (char)(depth + i);
	int r = lib1_inner(depth + (buf[depth & 63] & 3)); // LINE:lib2_hidden
	lib2_sink += r + buf[7];
	return r - 1;
}

__attribute__((noinline)) int lib2_middle(int depth)
{
	int r = lib2_hidden(depth + 1); // LINE:lib2_middle
	lib2_sink += r;
	return r + 2;
}
