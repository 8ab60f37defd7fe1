/*
 * ncclstub.c: a stand-in for NCCL's libnccl.so.2 as cudatrace's owner rules
 * see it: its communicator's buffers are VMM memory (NCCL_CUMEM_ENABLE, the
 * default since NCCL 2.19) made with the driver's cuMemCreate and mapped
 * with cuMemMap into a range it reserved, none through the runtime.
 *
 *   nccl_stub_init(device, chunks) -> 0: chunks x 2 MiB created and mapped
 *                                     on device, kept (as a communicator's)
 */
#include "cuda_decls.h"

#define EXPORT __attribute__((visibility("default")))
#define CHUNK ((size_t)2 << 20)

EXPORT int nccl_stub_init(int device, int chunks)
{
	CUdeviceptr va = 0;
	if (cuInit(0) != CUDA_SUCCESS || cuMemAddressReserve(&va, (size_t)chunks * CHUNK, 0, 0, 0) != CUDA_SUCCESS)
		return -1;
	for (int i = 0; i < chunks; i++) {
		CUmemAllocationProp prop = {.type = 1, .location = {.type = 1, .id = device}};
		CUmemGenericAllocationHandle h = 0;
		if (cuMemCreate(&h, CHUNK, &prop, 0) != CUDA_SUCCESS || cuMemMap(va + i * CHUNK, CHUNK, 0, h, 0) != CUDA_SUCCESS)
			return -1;
	}
	return 0;
}
