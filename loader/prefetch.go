//go:build amd64 || arm64

package loader

// prefetch asks the CPU to bring the 256 bytes at addr into its cache and
// goes on without waiting for them (prefetch_*.s): the next record's
// header and first lines, which BPF wrote from another CPU, while the
// handler works on this one. A hint: it never faults.
func prefetch(addr uintptr)
