/*
 * pidat: run a command as the process with a given PID, as CRIU restores
 * one: write PID-1 to /proc/sys/kernel/ns_last_pid (root of the host's PID
 * namespace) and fork at once; the child runs the command if it got the
 * PID, else exits and it is tried again (another process may have forked
 * in between). For tests of a PID that a traced process had and an
 * unrelated one takes after it ended.
 *
 *   pidat PID CMD [ARG...]
 *
 * Exits with the command's status, or 111 when the PID could not be had
 * in 1000 tries (still in use, or taken by others first each time).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: pidat PID CMD [ARG...]\n");
		return 2;
	}
	long want = strtol(argv[1], NULL, 10);
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%ld", want - 1);
	for (int try = 0; try < 1000; try++) {
		int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY);
		if (fd < 0 || write(fd, buf, n) != n) {
			fprintf(stderr, "pidat: ns_last_pid: %s\n", strerror(errno));
			return 111;
		}
		close(fd);
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "pidat: fork: %s\n", strerror(errno));
			return 111;
		}
		if (pid == 0) {
			if (getpid() != want)
				_exit(112);
			execvp(argv[2], argv + 2);
			fprintf(stderr, "pidat: %s: %s\n", argv[2], strerror(errno));
			_exit(127);
		}
		int st;
		if (waitpid(pid, &st, 0) < 0)
			return 111;
		if (pid != want)
			continue;
		return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	}
	fprintf(stderr, "pidat: pid %ld not had in 1000 tries\n", want);
	return 111;
}
