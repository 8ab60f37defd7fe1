/*
 * c10stub.c: a stand-in for PyTorch's libc10_cuda.so caching allocator, with
 * its USDT probes: pytorch:malloc(ptr, device, size, stream) when a tensor
 * gets a block, pytorch:free(ptr) when it gives it back, each guarded by a
 * semaphore as TORCH_SDT_WITH_SEMAPHORE does (the probe costs nothing until
 * a tracer attaches). Blocks are cut from 2 MiB segments it gets from
 * cudaMalloc and never returns, as a cache does; a freed block is reused by
 * the next tensor of the same rounded size.
 *
 *   c10_alloc(size, device) -> ptr    c10_free(ptr)
 *   c10_acquired() -> segment bytes cudaMalloc'd so far (the caller's truth
 *                     of which call acquired a segment)
 */
#define _SDT_HAS_SEMAPHORES 1
#include <stdint.h>
#include <stdlib.h>
#include <sys/sdt.h>

#include "cuda_decls.h"

#define EXPORT __attribute__((visibility("default")))
#define SEGMENT (2u << 20)

__extension__ unsigned short pytorch_malloc_semaphore __attribute__((unused, section(".probes")));
__extension__ unsigned short pytorch_free_semaphore __attribute__((unused, section(".probes")));

struct block {
	uintptr_t ptr;
	size_t size;
	int free;
};

static struct block blocks[4096];
static int nblocks;
static uintptr_t seg_next, seg_end;
static int seg_dev = -1;
static uint64_t acquired;

EXPORT uint64_t c10_acquired(void)
{
	return acquired;
}

EXPORT void *c10_alloc(size_t size, int device)
{
	size_t rounded = (size + 511) & ~(size_t)511;
	uintptr_t ptr = 0;
	int64_t stream = 7;
	signed char dev = (signed char)device; /* c10::DeviceIndex is an int8_t */

	for (int i = 0; i < nblocks; i++) {
		if (blocks[i].free && blocks[i].size == rounded) {
			blocks[i].free = 0;
			ptr = blocks[i].ptr;
			break;
		}
	}
	if (!ptr) {
		if (seg_dev != device || seg_next + rounded > seg_end) {
			void *seg;
			if (cudaSetDevice(device) != 0 || cudaMalloc(&seg, SEGMENT) != 0 || nblocks == 4096)
				return NULL;
			acquired += SEGMENT;
			seg_next = (uintptr_t)seg;
			seg_end = seg_next + SEGMENT;
			seg_dev = device;
		}
		ptr = seg_next;
		seg_next += rounded;
		blocks[nblocks++] = (struct block){ptr, rounded, 0};
	}
	if (pytorch_malloc_semaphore)
		STAP_PROBE4(pytorch, malloc, (void *)ptr, dev, size, stream);
	return (void *)ptr;
}

EXPORT void c10_free(void *p)
{
	for (int i = 0; i < nblocks; i++) {
		if (blocks[i].ptr == (uintptr_t)p && !blocks[i].free) {
			blocks[i].free = 1;
			if (pytorch_free_semaphore)
				STAP_PROBE1(pytorch, free, p);
			return;
		}
	}
}
