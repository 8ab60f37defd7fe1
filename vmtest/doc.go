// Package vmtest holds cudatrace's end-to-end tests: they build the
// cudatrace binary and stand-in CUDA libraries (testdata/fakecudart.c, which
// exports the real libcudart symbols with the real ABI and logs its own
// ground truth), run workloads under `cudatrace record`, and compare
// `cudatrace report --json` with that ground truth.
//
// Run them as root (they need CAP_BPF and CAP_PERFMON):
//
//	go test ./vmtest/
//
// Without the privileges the tracer tests skip, or fail when CI=true. The
// stand-in and ground-truth tests need only gcc and run unprivileged.
// VMTEST_KEEP=1 keeps the build directory and prints its path;
// VMTEST_CUDATRACE=/path/to/cudatrace tests that binary instead of building
// one from this module.
package vmtest
