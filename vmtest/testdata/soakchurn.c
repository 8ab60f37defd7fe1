/*
 * soakchurn: the soak's process churn (vmtest/soak_test.go, guest.sh's
 * ct_mode=soak), run as root in the guest beside the agent.
 *
 *   soakchurn alive
 *       prints "PROCESSES THREADS": the user-space tasks alive now (kernel
 *       threads, children of kthreadd, left out: they never reach a probe)
 *
 *   soakchurn run OUT AGENTPID UID CONC SAMPLES NOP CUDA MID RENAMED PY \
 *                 NOPBIN JOBBIN PYTHON PYSCRIPT
 *       starts NOP runs of NOPBIN, CUDA of "JOBBIN hold", MID of "JOBBIN mid",
 *       RENAMED of "JOBBIN renamed" and PY of "PYTHON PYSCRIPT", in an
 *       order shuffled once (a fixed seed), at most CONC at a time, each as
 *       UID (and its group). The CUDA jobs carry a torchrun identity
 *       (TORCHELASTIC_RUN_ID=soak-churn, RANK=their index). SAMPLES times,
 *       evenly over the run, and at its end, it reads the agent: its
 *       resident memory and threads (/proc/AGENTPID/status), its open files
 *       (/proc/AGENTPID/fd), the CPU time it used and its /metrics
 *       (127.0.0.1:9738), kept as OUT/metrics-N.txt; AGENTPID 0: no agent
 *       (the churn's cost without it). It writes:
 *         OUT/samples.txt  "N STARTED MS RSS_KB THREADS FDS PROCS TASKS CPU_MS"
 *         OUT/pids.txt     "KIND PID" of every job but the NOP runs
 *         OUT/summary.txt  "KIND STARTED FAILED MEAN_MS" per kind, then
 *                          "wall_ms W", "wraps W", "max_pid P"
 *       Exits 0 when every job exited 0, else 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "procstat.h"

enum { K_NOP, K_CUDA, K_MID, K_RENAMED, K_PY, NKINDS };
static const char *kind_names[NKINDS] = {"nop", "cuda", "mid", "renamed", "py"};

extern char **environ;

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* alive counts the user-space processes and their threads. */
static void alive(long *procs, long *tasks)
{
	char path[64], buf[1024];
	struct dirent *e;
	DIR *d = opendir("/proc");
	*procs = *tasks = 0;
	if (!d)
		return;
	while ((e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0 || pid == 2)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		if (!read_stat(path, buf, sizeof(buf)))
			continue;
		char *p = strrchr(buf, ')');
		char state;
		long ppid;
		if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2 || ppid == 2)
			continue;
		(*procs)++;
		snprintf(path, sizeof(path), "/proc/%ld/task", pid);
		DIR *t = opendir(path);
		if (!t)
			continue;
		struct dirent *te;
		while ((te = readdir(t)))
			if (te->d_name[0] != '.')
				(*tasks)++;
		closedir(t);
	}
	closedir(d);
}

/* status_kb reads a "Key:   N kB" (or a bare number) from /proc/PID/status. */
static long status_field(int pid, const char *key)
{
	char path[64], line[256];
	long v = -1;
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = strlen(key);
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':') {
			v = strtol(line + n + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

static long count_fds(int pid)
{
	char path[64];
	long n = 0;
	snprintf(path, sizeof(path), "/proc/%d/fd", pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n;
}

/* fetch_metrics GETs the agent's /metrics into path (the body only). */
static int fetch_metrics(const char *path)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(9738)};
	struct timeval tv = {.tv_sec = 30};
	char buf[65536];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		close(fd);
		return -1;
	}
	const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return -1;
	}
	FILE *out = fopen(path, "w");
	if (!out) {
		close(fd);
		return -1;
	}
	/* Headers end at the first blank line; the body follows. */
	int body = 0, ok = 0;
	char hold[4] = {0};
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t i = 0; i < n; i++) {
			if (body) {
				fputc(buf[i], out);
				continue;
			}
			memmove(hold, hold + 1, 3);
			hold[3] = buf[i];
			if (!memcmp(hold, "\r\n\r\n", 4))
				body = ok = 1;
		}
	}
	fclose(out);
	close(fd);
	return ok ? 0 : -1;
}

/* cpu_ms is the CPU time process pid has used (user and system), in ms. */
static long cpu_ms(int pid)
{
	char path[64], buf[1024];
	unsigned long ut, st;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if (!read_stat(path, buf, sizeof(buf)))
		return -1;
	char *p = strrchr(buf, ')');
	/* Fields 3 on; utime and stime are 14 and 15. */
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return -1;
	return (long)((ut + st) * 1000 / sysconf(_SC_CLK_TCK));
}

static FILE *samples_f;
static int agent_pid;
static char *out_dir;
static int nsample;

static void sample(long started, double t0)
{
	char path[4096];
	long procs, tasks;
	snprintf(path, sizeof(path), "%s/metrics-%02d.txt", out_dir, nsample);
	if (agent_pid > 0 && fetch_metrics(path) != 0)
		fprintf(stderr, "soakchurn: sample %d: no /metrics\n", nsample);
	alive(&procs, &tasks);
	fprintf(samples_f, "%d %ld %.0f %ld %ld %ld %ld %ld %ld\n", nsample, started, now_ms() - t0,
		status_field(agent_pid, "VmRSS"), status_field(agent_pid, "Threads"), count_fds(agent_pid), procs, tasks,
		cpu_ms(agent_pid));
	fflush(samples_f);
	/* The guest's console shows how far the churn got. */
	FILE *con = fopen("/dev/console", "w");
	if (con) {
		fprintf(con, "guest: soakchurn: %ld started in %.1fs, agent VmRSS %ld kB, CPU %ld ms\n", started,
			(now_ms() - t0) / 1e3, status_field(agent_pid, "VmRSS"), cpu_ms(agent_pid));
		fclose(con);
	}
	nsample++;
}

/* A running job: its kind and start, by pid. */
struct running {
	pid_t pid;
	int kind;
	double start;
};

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "alive")) {
		long procs, tasks;
		alive(&procs, &tasks);
		printf("%ld %ld\n", procs, tasks);
		return 0;
	}
	if (argc != 16 || strcmp(argv[1], "run")) {
		fprintf(stderr, "usage: soakchurn alive | soakchurn run OUT AGENTPID UID CONC SAMPLES NOP CUDA MID RENAMED PY "
				"NOPBIN JOBBIN PYTHON PYSCRIPT\n");
		return 2;
	}
	out_dir = argv[2];
	agent_pid = atoi(argv[3]);
	uid_t uid = (uid_t)atoi(argv[4]);
	int conc = atoi(argv[5]), nsamples = atoi(argv[6]);
	long want[NKINDS], total = 0;
	for (int k = 0; k < NKINDS; k++)
		total += want[k] = atol(argv[7 + k]);
	const char *nopbin = argv[12], *jobbin = argv[13], *python = argv[14], *pyscript = argv[15];
	if (conc < 1 || conc > 64 || nsamples < 1 || total < 1)
		return 2;

	char path[4096];
	snprintf(path, sizeof(path), "%s/samples.txt", out_dir);
	samples_f = fopen(path, "w");
	snprintf(path, sizeof(path), "%s/pids.txt", out_dir);
	FILE *pids_f = fopen(path, "w");
	if (!samples_f || !pids_f) {
		perror("soakchurn");
		return 2;
	}

	/* The order: every job's kind, shuffled (Fisher-Yates, fixed seed). */
	unsigned char *order = malloc(total);
	long i = 0;
	for (int k = 0; k < NKINDS; k++)
		for (long j = 0; j < want[k]; j++)
			order[i++] = (unsigned char)k;
	for (i = total - 1; i > 0; i--) {
		long j = (long)(next_rand() % (uint64_t)(i + 1));
		unsigned char c = order[i];
		order[i] = order[j];
		order[j] = c;
	}

	/* The CUDA jobs' environment: this one's and a torchrun identity. */
	long nenv = 0;
	while (environ[nenv])
		nenv++;
	char **cenv = calloc(nenv + 3, sizeof(char *));
	memcpy(cenv, environ, nenv * sizeof(char *));
	char rank[32];
	cenv[nenv] = "TORCHELASTIC_RUN_ID=soak-churn";
	cenv[nenv + 1] = rank;

	struct running *run = calloc(conc, sizeof(*run));
	long started[NKINDS] = {0}, failed[NKINDS] = {0};
	double spent[NKINDS] = {0};
	long wraps = 0, max_pid = 0, last_pid = 0, every = total / nsamples;
	int nrun = 0;
	double t0 = now_ms();
	if (every < 1)
		every = 1;
	sample(0, t0);
	for (i = 0; i < total || nrun > 0;) {
		if (i < total && nrun < conc) {
			int k = order[i];
			char *const nop_argv[] = {(char *)nopbin, NULL};
			char *const job_argv[] = {(char *)jobbin, k == K_CUDA ? "hold" : k == K_MID ? "mid" : "renamed", NULL};
			char *const py_argv[] = {(char *)python, (char *)pyscript, NULL};
			snprintf(rank, sizeof(rank), "RANK=%ld", i);
			pid_t pid = fork();
			if (pid == 0) {
				if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
					_exit(126);
				if (k == K_NOP)
					execve(nopbin, nop_argv, environ);
				else if (k == K_PY)
					execve(python, py_argv, environ);
				else
					execve(jobbin, job_argv, cenv);
				_exit(127);
			}
			if (pid < 0) {
				if (errno == EAGAIN) { /* every PID taken: wait for one */
					goto reap;
				}
				perror("soakchurn: fork");
				return 2;
			}
			if (pid < last_pid)
				wraps++;
			last_pid = pid;
			if (pid > max_pid)
				max_pid = pid;
			if (k != K_NOP)
				fprintf(pids_f, "%s %d\n", kind_names[k], pid);
			for (int s = 0; s < conc; s++)
				if (run[s].pid == 0) {
					run[s] = (struct running){pid, k, now_ms()};
					break;
				}
			nrun++;
			started[k]++;
			i++;
			if (i % every == 0 && i < total)
				sample(i, t0);
			continue;
		}
	reap:;
		int st;
		pid_t pid = waitpid(-1, &st, 0);
		if (pid < 0) {
			if (errno == EINTR)
				continue;
			perror("soakchurn: waitpid");
			return 2;
		}
		for (int s = 0; s < conc; s++)
			if (run[s].pid == pid) {
				int k = run[s].kind;
				spent[k] += now_ms() - run[s].start;
				if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
					failed[k]++;
					if (failed[k] <= 5)
						fprintf(stderr, "soakchurn: %s job %d ended with status %#x\n", kind_names[k], pid, st);
				}
				run[s].pid = 0;
				nrun--;
				break;
			}
	}
	double wall = now_ms() - t0;
	sample(total, t0);
	fclose(pids_f);
	fclose(samples_f);
	snprintf(path, sizeof(path), "%s/summary.txt", out_dir);
	FILE *f = fopen(path, "w");
	if (!f)
		return 2;
	long nfailed = 0;
	for (int k = 0; k < NKINDS; k++) {
		fprintf(f, "%s %ld %ld %.1f\n", kind_names[k], started[k], failed[k], started[k] ? spent[k] / started[k] : 0);
		nfailed += failed[k];
	}
	fprintf(f, "wall_ms %.0f\nwraps %ld\nmax_pid %ld\n", wall, wraps, max_pid);
	fclose(f);
	return nfailed ? 1 : 0;
}
