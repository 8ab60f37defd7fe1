// The executable of the chain in omitfp_lib1.c. It exits right after its
// one allocation: the tracer must have read its mappings at the first
// event to name any frame.
extern int lib1_outer(int depth);

volatile int main_sink;

int main(int argc, char **argv)
{
	(void)argv;
	int r = lib1_outer(argc); // LINE:main
	main_sink += r;
	return 0;
}
