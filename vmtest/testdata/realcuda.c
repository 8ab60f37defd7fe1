/*
 * realcuda [OUTFILE]: calls NVIDIA's real cudaMalloc (linked against
 * /usr/lib/x86_64-linux-gnu/libcudart.so.11.0 by full path) three times, with
 * 1, 2 and 3 MiB, and prints each return code (100, cudaErrorNoDevice, on a
 * machine without a GPU). With OUTFILE, it also writes the same lines there,
 * after a "pid=P" line. No CUDA header: the prototypes are declared here.
 */
#include <stdio.h>
#include <unistd.h>

int cudaMalloc(void **devPtr, size_t size);
int cudaFree(void *devPtr);

int main(int argc, char **argv)
{
	FILE *out = argc > 1 ? fopen(argv[1], "w") : NULL;

	if (argc > 1 && !out) {
		perror(argv[1]);
		return 2;
	}
	if (out)
		fprintf(out, "pid=%d\n", (int)getpid());
	for (size_t mib = 1; mib <= 3; mib++) {
		void *p = NULL;
		int ret = cudaMalloc(&p, mib << 20);
		printf("cudaMalloc(%zu) = %d\n", mib << 20, ret);
		if (out)
			fprintf(out, "cudaMalloc(%zu) = %d\n", mib << 20, ret);
		if (ret == 0)
			cudaFree(p);
	}
	if (out)
		fclose(out);
	return 0;
}
