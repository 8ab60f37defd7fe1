/*
 * fakecurand.c: a stand-in for libcurand.so.10 with the five functions
 * PyCUDA's _driver extension binds at load (Debian's python3-pycuda links
 * it; no CUDA toolkit is installed on the test machine, and none may be).
 * The symbols carry NVIDIA's version, libcurand.so.10 (fakecurand.map).
 * Nothing here allocates GPU memory; the direction vectors and scramble
 * constants are for pycuda.curandom's Sobol generators, which the tests
 * do not use: they report CURAND_STATUS_NOT_INITIALIZED.
 *
 * Build (the tests do this):
 *   gcc -shared -fPIC -O2 -Wl,-soname,libcurand.so.10 \
 *       -Wl,--version-script=fakecurand.map -o libcurand.so.10 fakecurand.c
 */
#define EXPORT __attribute__((visibility("default")))

enum { CURAND_STATUS_SUCCESS = 0, CURAND_STATUS_NOT_INITIALIZED = 101, CURAND_STATUS_OUT_OF_RANGE = 104 };

/* cuRAND 10.3.0 (CUDA 11.8's), the version Debian 12's PyCUDA was built with. */
EXPORT int curandGetVersion(int *version)
{
	if (!version)
		return CURAND_STATUS_OUT_OF_RANGE;
	*version = 10300;
	return CURAND_STATUS_SUCCESS;
}

EXPORT int curandGetDirectionVectors32(void **vectors, int set)
{
	(void)vectors, (void)set;
	return CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT int curandGetDirectionVectors64(void **vectors, int set)
{
	(void)vectors, (void)set;
	return CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT int curandGetScrambleConstants32(unsigned int **constants)
{
	(void)constants;
	return CURAND_STATUS_NOT_INITIALIZED;
}

EXPORT int curandGetScrambleConstants64(unsigned long long **constants)
{
	(void)constants;
	return CURAND_STATUS_NOT_INITIALIZED;
}
