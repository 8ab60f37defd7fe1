/*
 * A thread the Python interpreter never ran (as autograd's backward
 * threads are): alloc_on_thread allocates from a pthread of its own and
 * joins it. Loaded by pyframes.py through ctypes (vmtest/python_test.go).
 */
#include <pthread.h>
#include <stddef.h>

int cudaMalloc(void **ptr, size_t size);

static void *run(void *arg)
{
	void *p;
	return (void *)(long)cudaMalloc(&p, *(size_t *)arg);
}

int alloc_on_thread(size_t size)
{
	pthread_t t;
	void *rc;
	if (pthread_create(&t, NULL, run, &size))
		return -1;
	pthread_join(t, &rc);
	return (int)(long)rc;
}
