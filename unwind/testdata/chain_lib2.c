// The second library of the chain (see chain_lib1.c).
extern int lib1_inner(int depth);

volatile int lib2_sink;

__attribute__((noinline)) int lib2_middle(int depth)
{
	char buf[200]; // a frame of its own, sized unlike its neighbours'
	for (int i = 0; i < (int)sizeof(buf); i++)
		buf[i] = (char)(depth + i);
	int r = lib1_inner(depth + buf[depth & 63]); // LINE:lib2_middle
	lib2_sink += r + buf[7];
	return r - 1;
}
