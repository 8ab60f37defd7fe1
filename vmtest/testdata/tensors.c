/*
 * tensors ITERS: a training-loop-shaped use of the c10 stand-in's tensors
 * on devices 0 and 1, from named helpers (make_activation, make_weight).
 * Prints its own tensor-level tally:
 *   tensors: allocs=N frees=N alloc_bytes=N live=N peak=N
 * live and peak in bytes as requested (the probes report the requested size).
 * Then, per call site in main (its line) and per helper function, what
 * `report --by` must show, the segments from the stand-in's own count:
 *   site: line=N used=B used_count=N acquired=B acquired_count=N freed=B used_live=B
 *   function: name=F used=B used_count=N acquired=B acquired_count=N freed=B used_live=B
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *c10_alloc(size_t size, int device);
void c10_free(void *p);
uint64_t c10_acquired(void);

static uint64_t allocs, frees, alloc_bytes, live, peak;

/* One row of the truth: a call site in main, or a helper. */
struct tally {
	const char *name;
	int line;
	uint64_t used, used_count, acquired, acquired_count, freed, used_live;
};
static struct tally sites[4], funcs[2] = {{.name = "make_weight"}, {.name = "make_activation"}};
static int nsites;
static struct tally *site; /* the call site under way, set by main on the call's line */

static struct tally *at(int line)
{
	for (int i = 0; i < nsites; i++)
		if (sites[i].line == line)
			return site = &sites[i];
	sites[nsites].line = line;
	return site = &sites[nsites++];
}

static void *track(struct tally *fn, void *(*alloc)(size_t, int), size_t size, int dev)
{
	uint64_t before = c10_acquired();
	void *p = alloc(size, dev);
	uint64_t got = c10_acquired() - before;
	if (!p)
		exit(3);
	allocs++;
	alloc_bytes += size;
	live += size;
	if (live > peak)
		peak = live;
	struct tally *rows[2] = {site, fn};
	for (int i = 0; i < 2; i++) {
		rows[i]->used += size;
		rows[i]->used_count++;
		rows[i]->used_live += size;
		if (got) {
			rows[i]->acquired += got;
			rows[i]->acquired_count++;
		}
	}
	return p;
}

static void untrack(struct tally *s, struct tally *fn, void *p, size_t size)
{
	c10_free(p);
	frees++;
	live -= size;
	struct tally *rows[2] = {s, fn};
	for (int i = 0; i < 2; i++) {
		rows[i]->freed += size;
		rows[i]->used_live -= size;
	}
}

__attribute__((noinline)) static void *make_weight(size_t size, int dev)
{
	return track(&funcs[0], c10_alloc, size, dev);
}

__attribute__((noinline)) static void *make_activation(size_t size, int dev)
{
	return track(&funcs[1], c10_alloc, size, dev);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 10;
	at(__LINE__), make_weight(100000, 0);
	at(__LINE__), make_weight(30000, 1);
	for (int i = 0; i < iters; i++) {
		size_t a = 4096 + 512 * (size_t)(i % 3), b = 70000;
		struct tally *xs = at(__LINE__); void *x = make_activation(a, i % 2);
		struct tally *ys = at(__LINE__); void *y = make_activation(b, 0);
		untrack(xs, &funcs[1], x, a);
		if (i % 3)
			untrack(ys, &funcs[1], y, b);
	}
	/* Linger: the recorder reads the mappings when a process's first event
	 * arrives, and this test checks symbolized stacks; exiting within
	 * milliseconds of it is TestShortLived's case, not this one's. */
	usleep(300000);
	printf("tensors: allocs=%llu frees=%llu alloc_bytes=%llu live=%llu peak=%llu\n",
	       (unsigned long long)allocs, (unsigned long long)frees, (unsigned long long)alloc_bytes,
	       (unsigned long long)live, (unsigned long long)peak);
	for (int i = 0; i < nsites + 2; i++) {
		struct tally *t = i < nsites ? &sites[i] : &funcs[i - nsites];
		if (i < nsites)
			printf("site: line=%d", t->line);
		else
			printf("function: name=%s", t->name);
		printf(" used=%llu used_count=%llu acquired=%llu acquired_count=%llu freed=%llu used_live=%llu\n",
		       (unsigned long long)t->used, (unsigned long long)t->used_count,
		       (unsigned long long)t->acquired, (unsigned long long)t->acquired_count,
		       (unsigned long long)t->freed, (unsigned long long)t->used_live);
	}
	return 0;
}
