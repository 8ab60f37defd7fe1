/*
 * CHECK(call): a driver or runtime call that should succeed. A failure is
 * said on stderr, with the program's file and line, and counted in bad,
 * by which the program exits non-zero (atomically: threads check too).
 */
#ifndef CUDA_CHECK_H
#define CUDA_CHECK_H

#include <stdio.h>

static int bad;

#define CHECK(call)                                                                           \
	do {                                                                                  \
		int r_ = (int)(call);                                                         \
		if (r_ != 0) {                                                                \
			fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, r_);  \
			__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);                        \
		}                                                                             \
	} while (0)

#endif
