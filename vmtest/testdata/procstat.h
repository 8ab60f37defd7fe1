/*
 * read_stat: the workloads' one way to read a /proc stat file (of the
 * process or of one of its threads) into buf, NUL-terminated. Returns 0
 * when it cannot be opened (the task is gone), 1 otherwise. Field 2, the
 * command, may hold spaces and parentheses: callers count fields from the
 * last ')'.
 */
#ifndef CUDATRACE_VMTEST_PROCSTAT_H
#define CUDATRACE_VMTEST_PROCSTAT_H

#include <stdio.h>

static int read_stat(const char *path, char *buf, size_t size)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
	return 1;
}

#endif
