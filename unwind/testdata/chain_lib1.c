// The first library of an -O2 -fomit-frame-pointer call chain that crosses
// into a second library and back: lib1_outer -> lib2_middle -> lib1_inner.
extern int lib2_middle(int depth);
extern int chain_leaf(int depth);

volatile int lib1_sink;

__attribute__((noinline)) int lib1_inner(int depth)
{
	int r = chain_leaf(depth + 1); // LINE:lib1_inner
	lib1_sink += r;
	return r + 1;
}

__attribute__((noinline)) int lib1_outer(int depth)
{
	int r = lib2_middle(depth + 1); // LINE:lib1_outer
	lib1_sink += r;
	return r * 3;
}
