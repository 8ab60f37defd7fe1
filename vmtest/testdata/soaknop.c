/*
 * soaknop: the soak's commonest process (vmtest/soak_test.go): a program
 * linked dynamically, as nearly every program on a node is, that does
 * nothing and exits 0. Its dynamic loader calls _dl_debug_state as it
 * starts, so the agent's probe there sees it though it never touches CUDA.
 */
int main(void)
{
	return 0;
}
