/*
 * fakecudart.c: a stand-in for libcudart.so.12 for cudatrace's end-to-end
 * tests on machines without a GPU. It exports the real CUDA runtime symbols
 * with the real ABI, hands out fake device addresses from a first-fit
 * free-list allocator (so freed addresses are reused, as with real CUDA), and
 * logs its own ground truth.
 *
 * Build (the tests do this):
 *   gcc -shared -fPIC -O2 -fomit-frame-pointer -pthread \
 *       -Wl,-soname,libcudart.so.12 -Wl,--version-script=fakecudart.map \
 *       -o libcudart.so.12 fakecudart.c
 * No frame pointers, like the real libcudart.
 *
 * The same source, linked with -Wl,-soname,libcuda.so.1 and
 * --version-script=fakecuda.map, is the stand-in for the driver
 * (libcuda.so.1): its cuMem* functions share the allocator below (the
 * driver's error codes for these cases have the runtime's numbers), and
 * its contexts are fake handles naming a device, made current per thread.
 *
 * Environment:
 *   FAKECUDA_DEVICES    number of devices (default 2, at most 16)
 *   FAKECUDA_MEM_LIMIT  bytes per device, and for the managed and the pinned
 *                       host arenas (default 1 GiB, at most 64 GiB; K/M/G
 *                       suffixes allowed)
 *   FAKECUDA_LOG        if set, every call appends one line to this file:
 *     <api> pid=<pid> tid=<tid> ret=<int> ptr=0x<hex> size=<bytes> dev=<dev> kind=<kind> req=<bytes>
 *   api:  the function called, or a marker name from fakecuda_log_marker.
 *   ret:  the value returned.
 *   ptr:  allocations: the address returned (0x0 when failed); frees: the
 *         pointer passed; cuCtxGetCurrent: the context returned.
 *   size: allocations: the bytes reserved as the caller sees them (size;
 *         pitch*height for cudaMallocPitch; pitch*height*depth for
 *         cudaMalloc3D), 0 when failed; frees: the size the freed allocation
 *         had, 0 when nothing was freed; 0 for other calls.
 *   dev:  allocations and frees: the device the memory belongs to (the
 *         thread's current device for allocations of any kind, failed ones
 *         included); cudaSetDevice: the ordinal asked for; others: the
 *         thread's current device.
 *   kind: device, managed or host for allocations and frees (for a failed
 *         free: the kind the API frees); none for other calls.
 *   req:  allocations: the bytes asked for (size, width*height,
 *         width*height*depth, saturated at 2^64-1), also when failed; else 0.
 *   VMM (the driver's virtual memory management) differs: cuMemCreate is an
 *   allocation whose ptr is the handle; cuMemRelease of memory still mapped
 *   logs size=0, and the cuMemUnmap that removes its last mapping frees it
 *   (its size= is the physical bytes it freed, req= the range's length);
 *   cuMemMap logs ptr=<virtual address> size=<bytes mapped> dev=<the
 *   memory's device> req=<handle>; cuMemAddressReserve/cuMemAddressFree log
 *   kind=va with the range.
 * Lines are written with one write(2) on an O_APPEND descriptor while the
 * allocator's mutex is held, so their order in the file is the order in
 * which the calls took effect, across threads (and, O_APPEND being atomic,
 * across processes sharing the file).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_decls.h"

#define EXPORT __attribute__((visibility("default")))

#define ALIGN 512ULL
#define MAX_DEVICES 16
#define DEVICE_BASE 0x7e0000000000ULL /* device d at DEVICE_BASE + d<<36 */
#define DEVICE_STRIDE (1ULL << 36)
#define MANAGED_BASE 0x7d0000000000ULL
#define HOST_BASE 0x7c0000000000ULL
#define VA_BASE 0x7b0000000000ULL /* cuMemAddressReserve's ranges */
#define MAX_LIMIT (1ULL << 36)

enum kind { KIND_DEVICE, KIND_MANAGED, KIND_HOST, KIND_NONE, KIND_VA };
static const char *const kind_names[] = {"device", "managed", "host", "none", "va"};

struct extent {
	uint64_t start, len;
};

/* A range of fake addresses with a sorted, coalesced free list. */
struct arena {
	uint64_t base, limit;
	struct extent *free;
	size_t nfree, cap;
};

struct block {
	uint64_t addr, reserved, size;
	int dev;
	enum kind kind;
	uint64_t ctx; /* the context it was made in: it dies with it */
	int vmm;      /* made by cuMemCreate: addr is its handle */
	int mapped;   /* VMM: live cuMemMap mappings of it */
	int released; /* VMM: cuMemRelease'd while mapped; freed at its last unmap */
	struct block *next;
};

/* A live cuMemMap: size bytes of blk at virtual address va. */
struct mapping {
	uint64_t va, size;
	struct block *blk;
};
#define MAX_MAPPINGS 4096
static struct mapping mappings[MAX_MAPPINGS];
static int nmappings;

#define NBUCKETS 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int ndevices = 2;
static uint64_t mem_limit = 1ULL << 30;
static int log_fd = -1;
static struct arena dev_arena[MAX_DEVICES], managed_arena, host_arena, va_arena;
static struct block *buckets[NBUCKETS];

static __thread int cur_dev;
static uint64_t cur_ctx(void);
static __thread uint64_t ctx_stack[64]; /* the driver's context stack, top last */
static __thread int ctx_depth;
static __thread cudaError_t last_err;

static uint64_t parse_size(const char *s, uint64_t def)
{
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return def;
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s)
		return def;
	switch (*end) {
	case 'k': case 'K': v <<= 10; break;
	case 'm': case 'M': v <<= 20; break;
	case 'g': case 'G': v <<= 30; break;
	}
	return v;
}

static void arena_init(struct arena *a, uint64_t base, uint64_t limit)
{
	a->base = base;
	a->limit = limit;
	a->cap = 16;
	a->free = calloc(a->cap, sizeof(*a->free));
	if (!a->free)
		abort();
	a->free[0].start = base;
	a->free[0].len = limit;
	a->nfree = 1;
}

__attribute__((constructor)) static void fake_init(void)
{
	const char *s = getenv("FAKECUDA_DEVICES");
	const char *path = getenv("FAKECUDA_LOG");

	if (s && *s) {
		ndevices = atoi(s);
		if (ndevices < 1)
			ndevices = 1;
		if (ndevices > MAX_DEVICES)
			ndevices = MAX_DEVICES;
	}
	mem_limit = parse_size(getenv("FAKECUDA_MEM_LIMIT"), mem_limit);
	mem_limit &= ~(ALIGN - 1);
	if (mem_limit < ALIGN)
		mem_limit = ALIGN;
	if (mem_limit > MAX_LIMIT)
		mem_limit = MAX_LIMIT;
	for (int d = 0; d < ndevices; d++)
		arena_init(&dev_arena[d], DEVICE_BASE + (uint64_t)d * DEVICE_STRIDE, mem_limit);
	arena_init(&managed_arena, MANAGED_BASE, mem_limit);
	arena_init(&host_arena, HOST_BASE, mem_limit);
	arena_init(&va_arena, VA_BASE, MAX_LIMIT);
	if (path && *path) {
		log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (log_fd < 0)
			fprintf(stderr, "fakecudart: cannot open FAKECUDA_LOG %s: %s\n", path, strerror(errno));
	}
}

/* First fit. Returns 0 when nothing fits (0 is never a valid address here). */
static uint64_t arena_alloc(struct arena *a, uint64_t need)
{
	for (size_t i = 0; i < a->nfree; i++) {
		struct extent *e = &a->free[i];
		if (e->len < need)
			continue;
		uint64_t addr = e->start;
		e->start += need;
		e->len -= need;
		if (e->len == 0) {
			memmove(e, e + 1, (a->nfree - i - 1) * sizeof(*e));
			a->nfree--;
		}
		return addr;
	}
	return 0;
}

static void arena_free(struct arena *a, uint64_t start, uint64_t len)
{
	size_t lo = 0, hi = a->nfree;

	while (lo < hi) { /* first extent starting after start */
		size_t mid = (lo + hi) / 2;
		if (a->free[mid].start < start)
			lo = mid + 1;
		else
			hi = mid;
	}
	int merge_prev = lo > 0 && a->free[lo - 1].start + a->free[lo - 1].len == start;
	int merge_next = lo < a->nfree && start + len == a->free[lo].start;
	if (merge_prev && merge_next) {
		a->free[lo - 1].len += len + a->free[lo].len;
		memmove(&a->free[lo], &a->free[lo + 1], (a->nfree - lo - 1) * sizeof(struct extent));
		a->nfree--;
	} else if (merge_prev) {
		a->free[lo - 1].len += len;
	} else if (merge_next) {
		a->free[lo].start = start;
		a->free[lo].len += len;
	} else {
		if (a->nfree == a->cap) {
			a->cap *= 2;
			a->free = realloc(a->free, a->cap * sizeof(struct extent));
			if (!a->free)
				abort();
		}
		memmove(&a->free[lo + 1], &a->free[lo], (a->nfree - lo) * sizeof(struct extent));
		a->free[lo].start = start;
		a->free[lo].len = len;
		a->nfree++;
	}
}

static struct block **bucket(uint64_t addr)
{
	return &buckets[(addr / ALIGN * 0x9E3779B97F4A7C15ULL) >> 52];
}

static struct block *find_block(uint64_t addr)
{
	for (struct block *b = *bucket(addr); b; b = b->next)
		if (b->addr == addr)
			return b;
	return NULL;
}

static void unlink_block(struct block *blk)
{
	for (struct block **pp = bucket(blk->addr); *pp; pp = &(*pp)->next) {
		if (*pp == blk) {
			*pp = blk->next;
			return;
		}
	}
}

/* Called with mu held. */
static void log_line(const char *api, cudaError_t ret, uint64_t ptr, uint64_t size, int dev,
		     enum kind kind, uint64_t req)
{
	char buf[320];
	int n;

	if (log_fd < 0)
		return;
	n = snprintf(buf, sizeof(buf),
		     "%s pid=%d tid=%d ret=%d ptr=0x%llx size=%llu dev=%d kind=%s req=%llu\n", api,
		     (int)getpid(), (int)syscall(SYS_gettid), ret, (unsigned long long)ptr,
		     (unsigned long long)size, dev, kind_names[kind], (unsigned long long)req);
	if (n > 0 && (size_t)n < sizeof(buf)) {
		ssize_t w = write(log_fd, buf, (size_t)n);
		(void)w;
	}
}

static cudaError_t set_err(cudaError_t e)
{
	if (e != cudaSuccess)
		last_err = e;
	return e;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/*
 * Pinned host memory and managed memory are memory the CPU reads and
 * writes, as the driver's are (PyCUDA's pagelocked_empty and
 * managed_empty are numpy arrays over them): the first allocation of
 * either kind maps its whole arena at its fixed addresses, readable and
 * writable, reserved lazily (MAP_NORESERVE: pages are made when touched).
 * Called with mu held. If the addresses are taken, the arena stays
 * unbacked (its addresses still count; touching them faults).
 */
static void back_arena(struct arena *a)
{
	static int backed[2];
	int *done = a == &host_arena ? &backed[0] : a == &managed_arena ? &backed[1] : NULL;

	if (!done || *done)
		return;
	*done = 1;
	void *p = mmap((void *)(uintptr_t)a->base, a->limit, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p == MAP_FAILED || p != (void *)(uintptr_t)a->base) {
		fprintf(stderr, "fakecudart: cannot map host-visible memory at %#llx: %s\n",
			(unsigned long long)a->base, strerror(errno));
		if (p != MAP_FAILED)
			munmap(p, a->limit);
	}
}

/*
 * The one allocation path. bytes: what the caller will own (0 or
 * UINT64_MAX for invalid/overflowing requests), req: what was asked for.
 * On success stores the address in *addr_out; otherwise touches nothing.
 */
static cudaError_t do_alloc_on(const char *api, int dev, enum kind kind, int valid, uint64_t bytes, uint64_t req,
			       uint64_t *addr_out)
{
	cudaError_t ret = cudaSuccess;
	uint64_t addr = 0;
	struct arena *a = kind == KIND_DEVICE	 ? &dev_arena[dev]
			  : kind == KIND_MANAGED ? &managed_arena
			  : kind == KIND_VA	 ? &va_arena
						 : &host_arena;

	pthread_mutex_lock(&mu);
	if (!valid || bytes == 0) {
		ret = cudaErrorInvalidValue;
	} else if (bytes > a->limit) {
		ret = cudaErrorMemoryAllocation;
	} else {
		uint64_t need = (bytes + ALIGN - 1) & ~(ALIGN - 1);
		back_arena(a);
		addr = arena_alloc(a, need);
		if (!addr) {
			ret = cudaErrorMemoryAllocation;
		} else {
			struct block *b = malloc(sizeof(*b));
			if (!b)
				abort();
			b->addr = addr;
			b->reserved = need;
			b->size = bytes;
			b->dev = dev;
			b->kind = kind;
			b->ctx = cur_ctx();
			b->vmm = strcmp(api, "cuMemCreate") == 0;
			b->mapped = 0;
			b->released = 0;
			b->next = *bucket(addr);
			*bucket(addr) = b;
			*addr_out = addr;
		}
	}
	log_line(api, ret, addr, ret == cudaSuccess ? bytes : 0, dev, kind, req);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

static cudaError_t do_alloc(const char *api, enum kind kind, int valid, uint64_t bytes, uint64_t req,
			    uint64_t *addr_out)
{
	return do_alloc_on(api, cur_dev, kind, valid, bytes, req, addr_out);
}

/* Called with mu held. */
static void release_block(struct block *b)
{
	struct arena *a = b->kind == KIND_DEVICE    ? &dev_arena[b->dev]
			  : b->kind == KIND_MANAGED ? &managed_arena
			  : b->kind == KIND_VA	    ? &va_arena
						    : &host_arena;
	unlink_block(b);
	arena_free(a, b->addr, b->reserved);
	free(b);
}

/*
 * Frees ptr if it is a live allocation of one of the kinds allowed.
 * cuMemRelease of memory still mapped frees nothing yet (size=0 in the log):
 * the last cuMemUnmap of it does.
 */
static cudaError_t do_free(const char *api, void *ptr, int allow_gpu, int allow_host)
{
	cudaError_t ret = cudaSuccess;
	uint64_t addr = (uint64_t)(uintptr_t)ptr, size = 0;
	int dev = cur_dev;
	enum kind kind = allow_gpu ? KIND_DEVICE : KIND_HOST;

	pthread_mutex_lock(&mu);
	if (addr) {
		struct block *b = find_block(addr);
		int vmm_api = strcmp(api, "cuMemRelease") == 0;
		if (!b || b->kind == KIND_VA || (b->kind == KIND_HOST ? !allow_host : !allow_gpu) || b->vmm != vmm_api ||
		    b->released) {
			ret = cudaErrorInvalidValue;
		} else if (b->mapped) {
			/* The driver keeps mapped memory until its last unmap. */
			b->released = 1;
			dev = b->dev;
		} else {
			size = b->size;
			dev = b->dev;
			kind = b->kind;
			release_block(b);
		}
	}
	log_line(api, ret, addr, size, dev, kind, 0);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

static uint64_t round_pitch(uint64_t width)
{
	if (width > UINT64_MAX - ALIGN)
		return UINT64_MAX;
	return (width + ALIGN - 1) & ~(ALIGN - 1);
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	uint64_t addr;
	cudaError_t r = do_alloc("cudaMalloc", KIND_DEVICE, devPtr != NULL, size, size, &addr);
	if (r == cudaSuccess)
		*devPtr = (void *)(uintptr_t)addr;
	return r;
}

EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
	uint64_t addr;
	cudaError_t r;
	(void)stream;
	r = do_alloc("cudaMallocAsync", KIND_DEVICE, devPtr != NULL, size, size, &addr);
	if (r == cudaSuccess)
		*devPtr = (void *)(uintptr_t)addr;
	return r;
}

EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
	uint64_t addr;
	cudaError_t r;
	(void)stream;
	r = do_alloc("cudaMallocFromPoolAsync", KIND_DEVICE, ptr != NULL && memPool != NULL, size, size, &addr);
	if (r == cudaSuccess)
		*ptr = (void *)(uintptr_t)addr;
	return r;
}

EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	uint64_t addr;
	int valid = devPtr != NULL && (flags == cudaMemAttachGlobal || flags == cudaMemAttachHost);
	cudaError_t r = do_alloc("cudaMallocManaged", KIND_MANAGED, valid, size, size, &addr);
	if (r == cudaSuccess)
		*devPtr = (void *)(uintptr_t)addr;
	return r;
}

EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	uint64_t addr, p = round_pitch(width);
	int valid = devPtr != NULL && pitch != NULL && width != 0 && height != 0;
	cudaError_t r = do_alloc("cudaMallocPitch", KIND_DEVICE, valid, sat_mul(p, height), sat_mul(width, height),
				 &addr);
	if (r == cudaSuccess) {
		*devPtr = (void *)(uintptr_t)addr;
		*pitch = p;
	}
	return r;
}

EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent)
{
	uint64_t addr, p = round_pitch(extent.width);
	int valid = pitchedDevPtr != NULL && extent.width != 0 && extent.height != 0 && extent.depth != 0;
	cudaError_t r = do_alloc("cudaMalloc3D", KIND_DEVICE, valid, sat_mul(sat_mul(p, extent.height), extent.depth),
				 sat_mul(sat_mul(extent.width, extent.height), extent.depth), &addr);
	if (r == cudaSuccess) {
		pitchedDevPtr->ptr = (void *)(uintptr_t)addr;
		pitchedDevPtr->pitch = p;
		pitchedDevPtr->xsize = extent.width;
		pitchedDevPtr->ysize = extent.height;
	}
	return r;
}

/* Pinned host memory, for the runtime's and the driver's entry points. */
static cudaError_t host_alloc(const char *api, void **ptr, size_t size, unsigned int flags)
{
	uint64_t addr;
	cudaError_t r = do_alloc(api, KIND_HOST, ptr != NULL && (flags & ~0xFu) == 0, size, size, &addr);
	if (r == cudaSuccess)
		*ptr = (void *)(uintptr_t)addr;
	return r;
}

EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return host_alloc("cudaMallocHost", ptr, size, 0);
}

EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	return host_alloc("cudaHostAlloc", pHost, size, flags);
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
	return do_free("cudaFree", devPtr, 1, 0);
}

EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
	(void)stream;
	return do_free("cudaFreeAsync", devPtr, 1, 0);
}

EXPORT cudaError_t cudaFreeHost(void *ptr)
{
	return do_free("cudaFreeHost", ptr, 0, 1);
}

EXPORT cudaError_t cudaSetDevice(int device)
{
	cudaError_t ret = cudaSuccess;

	pthread_mutex_lock(&mu);
	if (device < 0 || device >= ndevices)
		ret = cudaErrorInvalidDevice;
	else {
		cur_dev = device;
		/* The runtime makes the device's primary context current. */
		if (ctx_depth > 0)
			ctx_stack[ctx_depth - 1] = 0xc7c0000ULL + 16 * (uint64_t)device;
	}
	log_line("cudaSetDevice", ret, 0, 0, device, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

EXPORT cudaError_t cudaGetDevice(int *device)
{
	cudaError_t ret = cudaSuccess;

	pthread_mutex_lock(&mu);
	if (!device)
		ret = cudaErrorInvalidValue;
	else
		*device = cur_dev;
	log_line("cudaGetDevice", ret, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

EXPORT cudaError_t cudaGetLastError(void)
{
	cudaError_t ret = last_err;

	last_err = cudaSuccess;
	pthread_mutex_lock(&mu);
	log_line("cudaGetLastError", ret, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

/* ---- The driver API. ---- */

/*
 * Contexts, as the driver has them (CUDA driver API docs): each thread has
 * a stack of contexts whose top is current. cuCtxCreate makes a context
 * (usage count 1) and pushes it; cuCtxAttach counts one more use;
 * cuCtxDetach counts one less and at zero destroys it; cuCtxDestroy
 * destroys it whatever its count; a destroyed context is popped from the
 * calling thread's stack when it is current there. A device's primary
 * context (cuDevicePrimaryCtxRetain) is counted by retain and release, and
 * its last release or a cuDevicePrimaryCtxReset (or the runtime's
 * cudaDeviceReset) destroys what it holds. Destroying a context frees
 * every allocation made in it: each is logged as an implicit_free line
 * (ptr, size, dev, kind of the allocation; req=the context's handle)
 * right after the call that destroyed it. The runtime's calls use the
 * current device's primary context.
 *
 * Handles: device d's primary context is CTX_BASE + 16*d; created contexts
 * are CTX_BASE + 0x1000 + 16*n, never reused.
 */
#define CTX_BASE 0xc7c0000ULL
#define CTX_CREATED (CTX_BASE + 0x1000)
#define MAX_CTX 256

struct fctx {
	int dev, refs, alive;
};
static struct fctx primaries[MAX_DEVICES];
static struct fctx created[MAX_CTX];
static int ncreated;

/* Called with mu held. */
static struct fctx *ctx_of(uint64_t h)
{
	if (h >= CTX_BASE && h < CTX_BASE + 16 * (uint64_t)ndevices && (h - CTX_BASE) % 16 == 0)
		return &primaries[(h - CTX_BASE) / 16];
	if (h >= CTX_CREATED && (h - CTX_CREATED) % 16 == 0 && (h - CTX_CREATED) / 16 < (uint64_t)ncreated) {
		struct fctx *c = &created[(h - CTX_CREATED) / 16];
		return c->alive ? c : NULL;
	}
	return NULL;
}

/* The context allocations of this thread go to now. */
static uint64_t cur_ctx(void)
{
	return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : CTX_BASE + 16 * (uint64_t)cur_dev;
}

/* Called with mu held: the thread's current device follows its stack's top. */
static void follow_top(void)
{
	if (ctx_depth > 0) {
		struct fctx *c = ctx_of(ctx_stack[ctx_depth - 1]);
		if (c)
			cur_dev = c->dev;
	}
}

/* Called with mu held: frees, and logs, every allocation made in h. */
static void free_ctx_memory(uint64_t h)
{
	for (int i = 0; i < NBUCKETS; i++) {
		struct block *b = buckets[i], *next;
		for (; b; b = next) {
			next = b->next;
			if (b->ctx != h || b->kind == KIND_VA || b->vmm)
				continue;
			log_line("implicit_free", cudaSuccess, b->addr, b->size, b->dev, b->kind, h);
			release_block(b);
		}
	}
}

/* Called with mu held: h dies; popped when current to the calling thread. */
static void destroy_ctx(uint64_t h, struct fctx *c)
{
	c->refs = 0;
	if (h >= CTX_CREATED)
		c->alive = 0;
	if (ctx_depth > 0 && ctx_stack[ctx_depth - 1] == h) {
		ctx_depth--;
		follow_top();
	}
	free_ctx_memory(h);
}

EXPORT CUresult cuInit(unsigned int flags)
{
	return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult ret = CUDA_SUCCESS;

	pthread_mutex_lock(&mu);
	if (!pctx)
		ret = CUDA_ERROR_INVALID_VALUE;
	else if (dev < 0 || dev >= ndevices)
		ret = CUDA_ERROR_INVALID_DEVICE;
	else {
		primaries[dev].dev = dev;
		primaries[dev].refs++;
		*pctx = (CUcontext)(uintptr_t)(CTX_BASE + 16 * (uint64_t)dev);
	}
	log_line("cuDevicePrimaryCtxRetain", ret, 0, 0, dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

static CUresult primary_drop(const char *api, CUdevice dev, int reset)
{
	CUresult ret = CUDA_SUCCESS;

	pthread_mutex_lock(&mu);
	if (dev < 0 || dev >= ndevices)
		ret = CUDA_ERROR_INVALID_DEVICE;
	else if (!reset && primaries[dev].refs == 0)
		ret = CUDA_ERROR_INVALID_CONTEXT;
	log_line(api, ret, 0, 0, dev, KIND_NONE, 0);
	if (ret == CUDA_SUCCESS) {
		uint64_t h = CTX_BASE + 16 * (uint64_t)dev;
		if (reset || --primaries[dev].refs == 0)
			free_ctx_memory(h);
		if (reset)
			primaries[dev].refs = 0;
	}
	pthread_mutex_unlock(&mu);
	return ret;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	return primary_drop("cuDevicePrimaryCtxRelease_v2", dev, 0);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	return primary_drop("cuDevicePrimaryCtxReset_v2", dev, 1);
}

EXPORT cudaError_t cudaDeviceReset(void)
{
	return primary_drop("cudaDeviceReset", cur_dev, 1);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	CUresult ret = CUDA_SUCCESS;
	(void)flags;

	pthread_mutex_lock(&mu);
	if (!pctx)
		ret = CUDA_ERROR_INVALID_VALUE;
	else if (dev < 0 || dev >= ndevices)
		ret = CUDA_ERROR_INVALID_DEVICE;
	else if (ncreated == MAX_CTX || ctx_depth == 64)
		ret = CUDA_ERROR_OUT_OF_MEMORY;
	else {
		uint64_t h = CTX_CREATED + 16 * (uint64_t)ncreated;
		created[ncreated++] = (struct fctx){.dev = dev, .refs = 1, .alive = 1};
		ctx_stack[ctx_depth++] = h;
		cur_dev = dev;
		*pctx = (CUcontext)(uintptr_t)h;
	}
	log_line("cuCtxCreate_v2", ret, 0, 0, dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

/* cuCtxDestroy_v2 and cuCtxDetach: ptr= in the log is the context. */
static CUresult drop_ctx(const char *api, CUcontext ctx, int detach)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t h = (uint64_t)(uintptr_t)ctx;
	struct fctx *c;
	int dev = cur_dev;

	pthread_mutex_lock(&mu);
	c = ctx_of(h);
	if (!c || h < CTX_CREATED)
		ret = CUDA_ERROR_INVALID_CONTEXT;
	else
		dev = c->dev;
	log_line(api, ret, h, 0, dev, KIND_NONE, 0);
	if (ret == CUDA_SUCCESS && (!detach || --c->refs == 0))
		destroy_ctx(h, c);
	pthread_mutex_unlock(&mu);
	return ret;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	return drop_ctx("cuCtxDestroy_v2", ctx, 0);
}

EXPORT CUresult cuCtxDetach(CUcontext ctx)
{
	return drop_ctx("cuCtxDetach", ctx, 1);
}

EXPORT CUresult cuCtxAttach(CUcontext *pctx, unsigned int flags)
{
	CUresult ret = CUDA_SUCCESS;
	(void)flags;

	pthread_mutex_lock(&mu);
	struct fctx *c = ctx_depth > 0 ? ctx_of(ctx_stack[ctx_depth - 1]) : NULL;
	if (!pctx)
		ret = CUDA_ERROR_INVALID_VALUE;
	else if (!c || ctx_stack[ctx_depth - 1] < CTX_CREATED)
		ret = CUDA_ERROR_INVALID_CONTEXT;
	else {
		c->refs++;
		*pctx = (CUcontext)(uintptr_t)ctx_stack[ctx_depth - 1];
	}
	log_line("cuCtxAttach", ret, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

/* cuCtxSetCurrent replaces the top of the stack (pushes on an empty one);
 * NULL pops. */
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t h = (uint64_t)(uintptr_t)ctx;

	pthread_mutex_lock(&mu);
	if (h == 0) {
		if (ctx_depth > 0)
			ctx_depth--;
		follow_top();
	} else if (!ctx_of(h)) {
		ret = CUDA_ERROR_INVALID_CONTEXT;
	} else {
		if (ctx_depth == 0)
			ctx_depth = 1;
		ctx_stack[ctx_depth - 1] = h;
		follow_top();
	}
	log_line("cuCtxSetCurrent", ret, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t h = (uint64_t)(uintptr_t)ctx;

	pthread_mutex_lock(&mu);
	if (!ctx_of(h))
		ret = CUDA_ERROR_INVALID_CONTEXT;
	else if (ctx_depth == 64)
		ret = CUDA_ERROR_INVALID_VALUE;
	else {
		ctx_stack[ctx_depth++] = h;
		follow_top();
	}
	log_line("cuCtxPushCurrent_v2", ret, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

/* As NVIDIA documents it: pops the thread's current context and passes
 * it back in *pctx (ptr= in the log); the one below is current again.
 * cuCtxPopCurrent is its name before CUDA 4.0, kept for binaries built
 * then: a function of its own here, logged under its own name. */
static CUresult pop_ctx(const char *api, CUcontext *pctx)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t popped = 0;

	pthread_mutex_lock(&mu);
	if (ctx_depth == 0) {
		ret = CUDA_ERROR_INVALID_CONTEXT;
	} else {
		popped = ctx_stack[ctx_depth - 1];
		if (pctx)
			*pctx = (CUcontext)(uintptr_t)popped;
		ctx_depth--;
		follow_top();
	}
	log_line(api, ret, popped, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return ret;
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	return pop_ctx("cuCtxPopCurrent_v2", pctx);
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
	return pop_ctx("cuCtxPopCurrent", pctx);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = ctx_depth > 0 ? (CUcontext)(uintptr_t)ctx_stack[ctx_depth - 1] : NULL;
	/* Logged: it tells a tracer that attached late the thread's device. */
	pthread_mutex_lock(&mu);
	log_line("cuCtxGetCurrent", CUDA_SUCCESS, (uint64_t)(uintptr_t)*pctx, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetDevice(CUdevice *dev)
{
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx_depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	*dev = cur_dev;
	pthread_mutex_lock(&mu); /* logged, as cuCtxGetCurrent */
	log_line("cuCtxGetDevice", CUDA_SUCCESS, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/*
 * What real clients ask of the driver besides memory (Numba's ctypes
 * driver binds these as it goes, PyCUDA at load): the devices, their
 * attributes, copies and streams that do nothing, IPC unsupported. Not
 * logged: they allocate nothing.
 */
#define CUDA_ERROR_NOT_SUPPORTED 801

EXPORT CUresult cuDriverGetVersion(int *v)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	*v = 12000;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *n)
{
	if (!n)
		return CUDA_ERROR_INVALID_VALUE;
	*n = ndevices;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
	if (!dev)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = ordinal;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "cudatrace stand-in GPU %d", dev);
	return CUDA_SUCCESS;
}

/* Attributes: compute capability 8.0 (75, 76), unified addressing (41),
 * mapped host memory (19), managed memory (83), PCI ids; 1024 for the
 * rest (threads, blocks, ...). */
EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case 75: *pi = 8; break;
	case 76: *pi = 0; break;
	case 19: case 41: case 83: *pi = 1; break;
	case 33: *pi = dev; break; /* PCI bus id */
	case 34: case 50: *pi = 0; break;
	case 16: *pi = 108; break; /* multiprocessors */
	case 10: *pi = 32; break;  /* warp size */
	default: *pi = 1024;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
	if (!major || !minor)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*major = 8;
	*minor = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev)
{
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	memset(uuid, 0, 16);
	uuid[0] = (unsigned char)dev;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	(void)dev;
	*bytes = mem_limit;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&mu);
	*flags = 0;
	*active = primaries[dev].refs > 0;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

/* Free memory: the current device's limit less what is allocated on it. */
EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	uint64_t used = 0;
	if (!free_bytes || !total)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < NBUCKETS; i++)
		for (struct block *b = buckets[i]; b; b = b->next)
			if (b->kind == KIND_DEVICE && b->dev == cur_dev)
				used += b->reserved;
	pthread_mutex_unlock(&mu);
	*total = mem_limit;
	*free_bytes = used < mem_limit ? mem_limit - used : 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, void *handle, unsigned int flags)
{
	(void)p, (void)handle, (void)flags;
	return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, void *handle, unsigned int flags)
{
	return cuIpcOpenMemHandle_v2(p, handle, flags);
}

EXPORT CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
	(void)flags;
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = (CUstream)(uintptr_t)0x5700;
	return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamSynchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst, (void)src, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)dst, (void)src, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) { (void)dst, (void)src, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) { (void)dst, (void)src, (void)n, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) { (void)dst, (void)src, (void)n, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) { (void)dst, (void)v, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream s) { (void)dst, (void)v, (void)n, (void)s; return CUDA_SUCCESS; }

/*
 * Mapped pinned memory: with unified addressing (the stand-in's devices
 * have it) the device sees pinned host memory at its host address. As the
 * driver, it refuses flags other than 0 and pointers outside pinned memory.
 */
EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags)
{
	uint64_t a = (uint64_t)(uintptr_t)p;
	int pinned = 0;
	if (!d || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < NBUCKETS && !pinned; i++)
		for (struct block *b = buckets[i]; b && !pinned; b = b->next)
			pinned = b->kind == KIND_HOST && a >= b->addr && a - b->addr < b->size;
	pthread_mutex_unlock(&mu);
	if (!pinned)
		return CUDA_ERROR_INVALID_VALUE;
	*d = (CUdeviceptr)a;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s)
{
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = e == 2 ? "out of memory" : "stand-in error";
	return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s)
{
	if (!s)
		return CUDA_ERROR_INVALID_VALUE;
	*s = e == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_UNKNOWN";
	return CUDA_SUCCESS;
}

/*
 * The rest of what PyCUDA's _driver extension (Debian's python3-pycuda)
 * binds when it is loaded: 156 cu* symbols, all resolved at dlopen. Those
 * on PyCUDA's allocation paths and around them (modules and launches for
 * gpuarray's kernels, events, limits, address ranges) behave as the CUDA
 * driver API's documentation says; the rest (arrays, textures, surfaces,
 * OpenGL, IPC, the linker, the rest of the pre-4.0 launch API) return
 * CUDA_ERROR_NOT_SUPPORTED, as a driver without the feature does. None of
 * them allocates, so none is logged.
 */
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217

/* Every argument is ignored: the ABI lets a function read fewer than it is passed. */
#define UNSUPPORTED(name) \
	EXPORT CUresult name(void) { return CUDA_ERROR_NOT_SUPPORTED; }
UNSUPPORTED(cuArray3DCreate_v2)
UNSUPPORTED(cuArray3DGetDescriptor_v2)
UNSUPPORTED(cuArrayCreate_v2)
UNSUPPORTED(cuArrayDestroy)
UNSUPPORTED(cuArrayGetDescriptor_v2)
UNSUPPORTED(cuGLCtxCreate_v2)
UNSUPPORTED(cuGLInit)
UNSUPPORTED(cuGLMapBufferObject_v2)
UNSUPPORTED(cuGLRegisterBufferObject)
UNSUPPORTED(cuGLUnmapBufferObject)
UNSUPPORTED(cuGLUnregisterBufferObject)
UNSUPPORTED(cuGraphicsGLRegisterBuffer)
UNSUPPORTED(cuGraphicsGLRegisterImage)
UNSUPPORTED(cuGraphicsMapResources)
UNSUPPORTED(cuGraphicsResourceGetMappedPointer_v2)
UNSUPPORTED(cuGraphicsSubResourceGetMappedArray)
UNSUPPORTED(cuGraphicsUnmapResources)
UNSUPPORTED(cuGraphicsUnregisterResource)
UNSUPPORTED(cuIpcCloseMemHandle)
UNSUPPORTED(cuIpcGetEventHandle)
UNSUPPORTED(cuIpcGetMemHandle)
UNSUPPORTED(cuIpcOpenEventHandle)
UNSUPPORTED(cuLaunch)
UNSUPPORTED(cuLaunchGrid)
UNSUPPORTED(cuLaunchGridAsync)
UNSUPPORTED(cuLinkAddData_v2)
UNSUPPORTED(cuLinkAddFile_v2)
UNSUPPORTED(cuLinkComplete)
UNSUPPORTED(cuLinkCreate_v2)
UNSUPPORTED(cuLinkDestroy)
UNSUPPORTED(cuMemHostGetFlags)
UNSUPPORTED(cuMemHostRegister_v2)
UNSUPPORTED(cuMemHostUnregister)
UNSUPPORTED(cuMemcpyAtoA_v2)
UNSUPPORTED(cuMemcpyAtoD_v2)
UNSUPPORTED(cuMemcpyAtoH_v2)
UNSUPPORTED(cuMemcpyDtoA_v2)
UNSUPPORTED(cuMemcpyHtoA_v2)
UNSUPPORTED(cuMemcpy3DPeer)
UNSUPPORTED(cuMemcpy3DPeerAsync)
UNSUPPORTED(cuModuleGetSurfRef)
UNSUPPORTED(cuModuleGetTexRef)
UNSUPPORTED(cuParamSetSize)
UNSUPPORTED(cuParamSetTexRef)
UNSUPPORTED(cuParamSetf)
UNSUPPORTED(cuParamSeti)
UNSUPPORTED(cuParamSetv)
UNSUPPORTED(cuSurfRefGetArray)
UNSUPPORTED(cuSurfRefSetArray)
UNSUPPORTED(cuTexRefCreate)
UNSUPPORTED(cuTexRefDestroy)
UNSUPPORTED(cuTexRefGetAddressMode)
UNSUPPORTED(cuTexRefGetAddress_v2)
UNSUPPORTED(cuTexRefGetArray)
UNSUPPORTED(cuTexRefGetFilterMode)
UNSUPPORTED(cuTexRefGetFlags)
UNSUPPORTED(cuTexRefGetFormat)
UNSUPPORTED(cuTexRefSetAddress2D_v3)
UNSUPPORTED(cuTexRefSetAddressMode)
UNSUPPORTED(cuTexRefSetAddress_v2)
UNSUPPORTED(cuTexRefSetArray)
UNSUPPORTED(cuTexRefSetFilterMode)
UNSUPPORTED(cuTexRefSetFlags)
UNSUPPORTED(cuTexRefSetFormat)

/* Calls that need a current context fail without one, as the driver's do. */
static CUresult need_ctx(void)
{
	return ctx_depth > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

/* The context's API version: 3020 for every context made since CUDA 3.2. */
EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
	CUresult r;
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	r = ctx ? (ctx_of((uint64_t)(uintptr_t)ctx) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT) : need_ctx();
	pthread_mutex_unlock(&mu);
	if (r == CUDA_SUCCESS)
		*version = 3020;
	return r;
}

/* Limits (CUlimit 0..6) and cache and shared-memory configurations, kept
 * per process: what was set is what is read back. */
static __thread size_t ctx_limits[7] = {1024, 1 << 20, 8 << 20, 2, 2048, 0, 0};
static __thread int cache_config, shmem_config;

EXPORT CUresult cuCtxGetLimit(size_t *value, int limit)
{
	if (!value || limit < 0 || limit > 6)
		return CUDA_ERROR_INVALID_VALUE;
	if (need_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	*value = ctx_limits[limit];
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t value)
{
	if (limit < 0 || limit > 6)
		return CUDA_ERROR_INVALID_VALUE;
	if (need_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	ctx_limits[limit] = value;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCacheConfig(int *config)
{
	if (!config)
		return CUDA_ERROR_INVALID_VALUE;
	*config = cache_config;
	return need_ctx();
}

EXPORT CUresult cuCtxSetCacheConfig(int config)
{
	if (config < 0 || config > 3)
		return CUDA_ERROR_INVALID_VALUE;
	cache_config = config;
	return need_ctx();
}

EXPORT CUresult cuCtxGetSharedMemConfig(int *config)
{
	if (!config)
		return CUDA_ERROR_INVALID_VALUE;
	*config = shmem_config;
	return need_ctx();
}

EXPORT CUresult cuCtxSetSharedMemConfig(int config)
{
	if (config < 0 || config > 2)
		return CUDA_ERROR_INVALID_VALUE;
	shmem_config = config;
	return need_ctx();
}

/* No peer-to-peer between the stand-in's devices. */
EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
	if (!can)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices || peer < 0 || peer >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*can = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	(void)peer;
	return flags ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

EXPORT CUresult cuCtxDisablePeerAccess(CUcontext peer)
{
	(void)peer;
	return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

/* Device d sits at PCI bus d (cuDeviceGetAttribute's bus id). */
EXPORT CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice dev)
{
	if (!id || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev < 0 || dev >= ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(id, (size_t)len, "0000:%02x:00.0", dev);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *id)
{
	unsigned dom, bus, slot, fn;
	if (!dev || !id || sscanf(id, "%x:%x:%x.%x", &dom, &bus, &slot, &fn) != 4)
		return CUDA_ERROR_INVALID_VALUE;
	if (dom != 0 || slot != 0 || fn != 0 || bus >= (unsigned)ndevices)
		return CUDA_ERROR_INVALID_DEVICE;
	*dev = (CUdevice)bus;
	return CUDA_SUCCESS;
}

/* Events complete at once: nothing runs on the stand-in's devices. */
static uint64_t next_handle = 0xe0000;

EXPORT CUresult cuEventCreate(void **ev, unsigned int flags)
{
	if (!ev || (flags & ~0xfu))
		return CUDA_ERROR_INVALID_VALUE;
	if (need_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	*ev = (void *)(uintptr_t)__atomic_add_fetch(&next_handle, 16, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(void *ev) { return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuEventRecord(void *ev, CUstream s) { (void)s; return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuEventQuery(void *ev) { return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuEventSynchronize(void *ev) { return ev ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

EXPORT CUresult cuEventElapsedTime(float *ms, void *start, void *end)
{
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	if (!start || !end)
		return CUDA_ERROR_INVALID_HANDLE;
	*ms = 0;
	return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery(CUstream s) { (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuStreamWaitEvent(CUstream s, void *ev, unsigned int flags)
{
	(void)s;
	return !ev ? CUDA_ERROR_INVALID_HANDLE : flags ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
EXPORT CUresult cuStreamAttachMemAsync(CUstream s, CUdeviceptr p, size_t len, unsigned int flags)
{
	(void)s, (void)len;
	return p && (flags == 1 || flags == 2 || flags == 4) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuProfilerInitialize(const char *cfg, const char *out, int mode) { (void)cfg, (void)out, (void)mode; return CUDA_SUCCESS; }
EXPORT CUresult cuProfilerStart(void) { return CUDA_SUCCESS; }
EXPORT CUresult cuProfilerStop(void) { return CUDA_SUCCESS; }

/*
 * Modules: any image loads (nvcc's stand-in writes its source as the
 * "cubin"), in the current context; every function name is found.
 * Launches do nothing.
 */
static CUresult module_load(void **mod, const void *image)
{
	if (!mod || !image)
		return CUDA_ERROR_INVALID_VALUE;
	if (need_ctx())
		return CUDA_ERROR_INVALID_CONTEXT;
	*mod = (void *)(uintptr_t)__atomic_add_fetch(&next_handle, 16, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleLoad(void **mod, const char *fname)
{
	if (fname && access(fname, R_OK) != 0)
		return CUDA_ERROR_NOT_FOUND;
	return module_load(mod, fname);
}
EXPORT CUresult cuModuleLoadData(void **mod, const void *image) { return module_load(mod, image); }
EXPORT CUresult cuModuleLoadDataEx(void **mod, const void *image, unsigned int n, void *opts, void **vals)
{
	(void)n, (void)opts, (void)vals;
	return module_load(mod, image);
}
EXPORT CUresult cuModuleUnload(void *mod) { return mod ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

EXPORT CUresult cuModuleGetFunction(void **f, void *mod, const char *name)
{
	if (!f || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!mod)
		return CUDA_ERROR_INVALID_HANDLE;
	*f = (void *)(uintptr_t)__atomic_add_fetch(&next_handle, 16, __ATOMIC_RELAXED);
	return CUDA_SUCCESS;
}

/* The stand-in's modules have no __device__ variables. */
EXPORT CUresult cuModuleGetGlobal_v2(CUdeviceptr *p, size_t *bytes, void *mod, const char *name)
{
	(void)p, (void)bytes;
	return !mod ? CUDA_ERROR_INVALID_HANDLE : !name ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_FOUND;
}

/* Function attributes (CUfunction_attribute) of a small kernel. */
EXPORT CUresult cuFuncGetAttribute(int *v, int attrib, void *f)
{
	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	switch (attrib) {
	case 0: *v = 1024; break; /* max threads per block */
	case 4: *v = 16; break;   /* registers */
	case 5: case 6: *v = 80; break; /* PTX and binary versions */
	default: *v = 0;
	}
	return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(void *f, int attrib, int v) { (void)attrib, (void)v; return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EXPORT CUresult cuFuncSetCacheConfig(void *f, int c) { (void)c; return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

/* The pre-4.0 way to give a launch its block, which PyCUDA's prepared_async_call still uses before cuLaunchKernel. */
EXPORT CUresult cuFuncSetBlockShape(void *f, int x, int y, int z)
{
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	return x > 0 && y > 0 && z > 0 && (int64_t)x * y * z <= 1024 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuFuncSetSharedSize(void *f, unsigned int bytes) { (void)bytes; return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			       unsigned shmem, CUstream s, void **params, void **extra)
{
	(void)shmem, (void)s, (void)params, (void)extra;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	return need_ctx();
}

/* Copies and sets move nothing: the stand-in's device memory has no bytes. */
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { (void)d, (void)s, (void)n, (void)st; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeer(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n) { (void)d, (void)dc, (void)s, (void)sc, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) { (void)d, (void)dc, (void)s, (void)sc, (void)n, (void)st; return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpy2D_v2(const void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy2DUnaligned_v2(const void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy2DAsync_v2(const void *p, CUstream s) { (void)s; return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy3D_v2(const void *p) { return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemcpy3DAsync_v2(const void *p, CUstream s) { (void)s; return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemsetD16_v2(CUdeviceptr d, unsigned short v, size_t n) { (void)d, (void)v, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD16Async(CUdeviceptr d, unsigned short v, size_t n, CUstream s) { (void)d, (void)v, (void)n, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD32_v2(CUdeviceptr d, unsigned int v, size_t n) { (void)d, (void)v, (void)n; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD32Async(CUdeviceptr d, unsigned int v, size_t n, CUstream s) { (void)d, (void)v, (void)n, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D8_v2(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h) { (void)d, (void)p, (void)v, (void)w, (void)h; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr d, size_t p, unsigned char v, size_t w, size_t h, CUstream s) { (void)d, (void)p, (void)v, (void)w, (void)h, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D16_v2(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h) { (void)d, (void)p, (void)v, (void)w, (void)h; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D16Async(CUdeviceptr d, size_t p, unsigned short v, size_t w, size_t h, CUstream s) { (void)d, (void)p, (void)v, (void)w, (void)h, (void)s; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D32_v2(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h) { (void)d, (void)p, (void)v, (void)w, (void)h; return CUDA_SUCCESS; }
EXPORT CUresult cuMemsetD2D32Async(CUdeviceptr d, size_t p, unsigned int v, size_t w, size_t h, CUstream s) { (void)d, (void)p, (void)v, (void)w, (void)h, (void)s; return CUDA_SUCCESS; }

/* The allocation holding p: its base and the size the caller asked for. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
	CUresult r = CUDA_ERROR_NOT_FOUND;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < NBUCKETS && r != CUDA_SUCCESS; i++)
		for (struct block *b = buckets[i]; b; b = b->next)
			if (b->kind != KIND_VA && !b->vmm && p >= b->addr && p - b->addr < b->size) {
				if (base)
					*base = b->addr;
				if (size)
					*size = b->size;
				r = CUDA_SUCCESS;
				break;
			}
	pthread_mutex_unlock(&mu);
	return r;
}


/* drv_alloc wraps do_alloc for the driver's (CUdeviceptr *, size) shape. */
static CUresult drv_alloc(const char *api, enum kind kind, int valid, uint64_t bytes, uint64_t req, CUdeviceptr *out)
{
	uint64_t addr;
	CUresult r = do_alloc(api, kind, valid, bytes, req, &addr);
	if (r == CUDA_SUCCESS)
		*out = addr;
	return r;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	return drv_alloc("cuMemAlloc_v2", KIND_DEVICE, dptr != NULL, bytesize, bytesize, dptr);
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	(void)hStream;
	return drv_alloc("cuMemAllocAsync", KIND_DEVICE, dptr != NULL, bytesize, bytesize, dptr);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	(void)hStream;
	return drv_alloc("cuMemAllocFromPoolAsync", KIND_DEVICE, dptr != NULL && pool != NULL, bytesize, bytesize, dptr);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	int valid = dptr != NULL && (flags == cudaMemAttachGlobal || flags == cudaMemAttachHost);
	return drv_alloc("cuMemAllocManaged", KIND_MANAGED, valid, bytesize, bytesize, dptr);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
				   unsigned int ElementSizeBytes)
{
	uint64_t p = round_pitch(WidthInBytes);
	int valid = dptr != NULL && pPitch != NULL && WidthInBytes != 0 && Height != 0 &&
		    (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16);
	CUresult r = drv_alloc("cuMemAllocPitch_v2", KIND_DEVICE, valid, sat_mul(p, Height), sat_mul(WidthInBytes, Height),
			       dptr);
	if (r == CUDA_SUCCESS)
		*pPitch = p;
	return r;
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	return host_alloc("cuMemAllocHost_v2", pp, bytesize, 0);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	return host_alloc("cuMemHostAlloc", pp, bytesize, Flags);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	return do_free("cuMemFree_v2", (void *)(uintptr_t)dptr, 1, 0);
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	return do_free("cuMemFreeAsync", (void *)(uintptr_t)dptr, 1, 0);
}

EXPORT CUresult cuMemFreeHost(void *p)
{
	return do_free("cuMemFreeHost", p, 0, 1);
}

/*
 * Virtual memory management: physical memory is created on the device its
 * properties name (location.type 1 is CU_MEM_LOCATION_TYPE_DEVICE); the
 * handle returned is the stand-in's address for it.
 */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			    unsigned long long flags)
{
	int valid = handle != NULL && prop != NULL && flags == 0 && prop->location.type == 1 &&
		    prop->location.id >= 0 && prop->location.id < ndevices;
	int dev = valid ? prop->location.id : cur_dev;
	uint64_t addr;
	CUresult r = do_alloc_on("cuMemCreate", dev, KIND_DEVICE, valid, size, size, &addr);
	if (r == CUDA_SUCCESS)
		*handle = addr;
	return r;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	return do_free("cuMemRelease", (void *)(uintptr_t)handle, 1, 0);
}

/*
 * Virtual address ranges hold no memory; they come from an arena of their
 * own. Logged with kind=va: ptr the range, size its length.
 */
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				    unsigned long long flags)
{
	uint64_t va;
	(void)alignment;
	(void)addr;
	CUresult r = do_alloc_on("cuMemAddressReserve", cur_dev, KIND_VA, ptr != NULL && flags == 0, size, size, &va);
	if (r == CUDA_SUCCESS)
		*ptr = va;
	return r;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t freed = 0;
	pthread_mutex_lock(&mu);
	struct block *b = find_block(ptr);
	if (!b || b->kind != KIND_VA || b->size != size) {
		ret = CUDA_ERROR_INVALID_VALUE;
	} else {
		freed = b->size;
		release_block(b);
	}
	log_line("cuMemAddressFree", ret, ptr, freed, cur_dev, KIND_VA, 0);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

/*
 * cuMemMap: logged with ptr the virtual address, size the bytes mapped,
 * dev the physical memory's device, req the handle.
 */
EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			 unsigned long long flags)
{
	CUresult ret = CUDA_SUCCESS;
	int dev = cur_dev;
	pthread_mutex_lock(&mu);
	struct block *b = find_block(handle);
	int taken = 0;
	for (int i = 0; i < nmappings; i++)
		taken |= mappings[i].va < ptr + size && ptr < mappings[i].va + mappings[i].size;
	if (!b || !b->vmm || b->released || ptr == 0 || size == 0 || flags != 0 || offset + size > b->size ||
	    taken || nmappings == MAX_MAPPINGS) {
		ret = CUDA_ERROR_INVALID_VALUE;
	} else {
		mappings[nmappings++] = (struct mapping){.va = ptr, .size = size, .blk = b};
		b->mapped++;
		dev = b->dev;
	}
	log_line("cuMemMap", ret, ptr, ret == CUDA_SUCCESS ? size : 0, dev, KIND_DEVICE, handle);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

/*
 * cuMemUnmap removes the whole mappings that start in [ptr, ptr+size). Logged
 * with size the physical bytes this freed (memory released while mapped)
 * and req the range's length.
 */
EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult ret = CUDA_SUCCESS;
	uint64_t freed = 0;
	int found = 0;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nmappings;) {
		struct mapping m = mappings[i];
		if (m.va < ptr || m.va - ptr >= size) {
			i++;
			continue;
		}
		found++;
		mappings[i] = mappings[--nmappings];
		if (--m.blk->mapped == 0 && m.blk->released) {
			freed += m.blk->size;
			release_block(m.blk);
		}
	}
	if (!found)
		ret = CUDA_ERROR_INVALID_VALUE;
	log_line("cuMemUnmap", ret, ptr, freed, cur_dev, KIND_DEVICE, size);
	pthread_mutex_unlock(&mu);
	return set_err(ret);
}

EXPORT void fakecuda_log_marker(const char *name)
{
	char clean[64];
	size_t i;

	/* One token, so the log stays one "api key=value..." line. */
	for (i = 0; name && name[i] && i < sizeof(clean) - 1; i++)
		clean[i] = (name[i] <= ' ' || name[i] == '=') ? '_' : name[i];
	clean[i] = 0;
	pthread_mutex_lock(&mu);
	log_line(i ? clean : "MARKER", cudaSuccess, 0, 0, cur_dev, KIND_NONE, 0);
	pthread_mutex_unlock(&mu);
}
