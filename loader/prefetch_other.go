//go:build !amd64 && !arm64

package loader

// prefetch is a hint the CPUs without prefetch_*.s go without.
func prefetch(addr uintptr) {}
