// The executable over ctr_work.c's library (vmtest/container_test.go).
// Prints "ready", allocates once when stdin gives a line, prints
// "allocated", and exits when stdin gives another line or ends.
#include <stdio.h>

extern int work(int depth);

volatile int main_sink;

int main(void)
{
	char line[64];

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 2;
	int r = work(1); // LINE:main
	main_sink += r;
	printf("allocated\n");
	fflush(stdout);
	if (fgets(line, sizeof(line), stdin))
		main_sink++;
	return 0;
}
