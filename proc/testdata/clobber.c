// Renames itself as setproctitle does on Linux (py-setproctitle's
// spt_status.c, "clobber argv"): copies its environment's strings to the
// heap, points environ at the copies, then writes a title over the one
// area argv and the environment were laid out in and pads the rest with
// NULs. Then it says "ready" and waits for stdin to close
// (proc/libcenv_test.go).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

int main(int argc, char **argv) {
	char *end = argv[0] + strlen(argv[0]) + 1;
	for (int i = 1; i < argc && argv[i] == end; i++)
		end = argv[i] + strlen(argv[i]) + 1;
	int n = 0;
	while (environ[n])
		n++;
	for (int i = 0; i < n && environ[i] == end; i++)
		end = environ[i] + strlen(environ[i]) + 1;
	char **copy = malloc((n + 1) * sizeof *copy);
	for (int i = 0; i < n; i++)
		copy[i] = strdup(environ[i]);
	copy[n] = NULL;
	environ = copy;
	const char *title = "ray::Worker";
	size_t area = end - argv[0];
	memset(argv[0], 0, area);
	memcpy(argv[0], title, strlen(title) < area ? strlen(title) : area - 1);
	printf("ready %s\n", getenv("RANK") ? getenv("RANK") : "-");
	fflush(stdout);
	char buf[64];
	while (read(0, buf, sizeof buf) > 0)
		;
	return 0;
}
