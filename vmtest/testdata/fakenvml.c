/*
 * fakenvml: a stand-in libnvidia-ml.so.1 with the functions cudatrace's
 * NVML queries call (through go-nvml), their real signatures and return
 * codes, and what it reports read from a file the test writes:
 *
 *   FAKENVML_PROCS  a file of lines "<pid> <device> <used bytes>": the
 *                   processes on each device (missing file: none)
 *   FAKENVML_DEVICES  how many devices (default 2), each of 16 GiB, named
 *                   "Fake NVML GPU", UUID "GPU-fake-<index>"; a device's
 *                   used bytes are the sum of its processes'
 *
 * nvmlDeviceGetComputeRunningProcesses (v1) and the graphics list's v1 are
 * exported only so that a lookup finds them; callers get the _v3 ones.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7

#define TOTAL (16ULL << 30)
#define MAXDEV 8
#define MAXPROC 64

struct fake_device {
	unsigned int index;
};

typedef struct {
	unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
	unsigned int version;
	unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

/* nvmlProcessInfo_v2_t, the layout of _v2 and _v3. */
typedef struct {
	unsigned int pid;
	unsigned long long usedGpuMemory;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static struct fake_device devices[MAXDEV];
static int initialized;

struct proc {
	unsigned int pid, dev;
	unsigned long long used;
};

static unsigned int ndevices(void)
{
	const char *s = getenv("FAKENVML_DEVICES");
	int n = s ? atoi(s) : 2;
	return n < 0 ? 0 : n > MAXDEV ? MAXDEV : n;
}

static int read_procs(struct proc *out)
{
	const char *path = getenv("FAKENVML_PROCS");
	FILE *f;
	int n = 0;
	if (!path || !(f = fopen(path, "r")))
		return 0;
	while (n < MAXPROC && fscanf(f, "%u %u %llu", &out[n].pid, &out[n].dev, &out[n].used) == 3)
		n++;
	fclose(f);
	return n;
}

nvmlReturn_t nvmlInit_v2(void)
{
	initialized++;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlShutdown(void)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	initialized--;
	return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r)
{
	switch (r) {
	case NVML_SUCCESS:
		return "Success";
	case NVML_ERROR_UNINITIALIZED:
		return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT:
		return "Invalid Argument";
	case NVML_ERROR_INSUFFICIENT_SIZE:
		return "Insufficient Size";
	}
	return "Unknown Error";
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	*n = ndevices();
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
	if (!initialized)
		return NVML_ERROR_UNINITIALIZED;
	if (i >= ndevices() || !d)
		return NVML_ERROR_INVALID_ARGUMENT;
	devices[i].index = i;
	*d = &devices[i];
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length)
{
	if (!d || !uuid)
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(uuid, length, "GPU-fake-%u", d->index);
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length)
{
	if (!d || !name)
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(name, length, "Fake NVML GPU");
	return NVML_SUCCESS;
}

static unsigned long long device_used(nvmlDevice_t d)
{
	struct proc p[MAXPROC];
	unsigned long long used = 0;
	int n = read_procs(p);
	for (int i = 0; i < n; i++)
		if (p[i].dev == d->index)
			used += p[i].used;
	return used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
	if (!d || !m)
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = TOTAL;
	m->used = device_used(d);
	m->free = TOTAL - m->used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
	if (!d || !m || m->version != (sizeof(*m) | 2u << 24))
		return NVML_ERROR_INVALID_ARGUMENT;
	m->total = TOTAL;
	m->reserved = 0;
	m->used = device_used(d);
	m->free = TOTAL - m->used;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
	struct proc p[MAXPROC];
	unsigned int k = 0;
	int n;
	if (!d || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	n = read_procs(p);
	for (int i = 0; i < n; i++)
		if (p[i].dev == d->index)
			k++;
	if (k > *count) {
		*count = k;
		return NVML_ERROR_INSUFFICIENT_SIZE;
	}
	k = 0;
	for (int i = 0; i < n; i++) {
		if (p[i].dev != d->index)
			continue;
		infos[k].pid = p[i].pid;
		infos[k].usedGpuMemory = p[i].used;
		infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFF;
		k++;
	}
	*count = k;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
	(void)infos;
	if (!d || !count)
		return NVML_ERROR_INVALID_ARGUMENT;
	*count = 0;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos)
{
	(void)d, (void)count, (void)infos;
	return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *count, void *infos)
{
	(void)d, (void)count, (void)infos;
	return NVML_ERROR_NOT_SUPPORTED;
}
