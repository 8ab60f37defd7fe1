// uwdeep ROUNDS DEPTH: ROUNDS times, an allocation DEPTH frames deep
// through two libraries without frame pointers (uwdeep_lib.c), from the
// main thread, from a second thread, and every tenth round from a signal
// handler; then, from a library dlopen'ed a moment before, once more.
// Each round sleeps a millisecond: the tracer's rules for the files come
// while it runs.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int uw_1(int depth);

static int depth;

static void on_signal(int sig)
{
	(void)sig;
	uw_1(3);
}

static void *thread_main(void *arg)
{
	(void)arg;
	uw_1(depth);
	return NULL;
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 100;
	depth = argc > 2 ? atoi(argv[2]) : 100;
	signal(SIGUSR1, on_signal);
	for (int i = 0; i < rounds; i++) {
		if (uw_1(depth) != 0)
			return 1;
		pthread_t t;
		if (pthread_create(&t, NULL, thread_main, NULL) == 0)
			pthread_join(t, NULL);
		if (i % 10 == 0)
			raise(SIGUSR1);
		usleep(1000);
	}
	if (argc > 3) {
		void *h = dlopen(argv[3], RTLD_NOW);
		int (*f)(int) = h ? (int (*)(int))dlsym(h, "uw_1") : NULL;
		if (!f || f(5) != 0)
			return 2;
	}
	return 0;
}
