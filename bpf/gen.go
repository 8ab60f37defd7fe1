// Package bpf holds cudatrace's BPF programs and their bpf2go-generated Go
// bindings. The generated cudatrace_x86_bpfel.{go,o} are committed so that
// `go build` needs no clang; `make generate` rebuilds them and CI checks
// that they match the C source.
package bpf

// -target amd64: PT_REGS_* need the architecture, and uprobes read x86-64
// registers. -I/usr/include/x86_64-linux-gnu: <asm/ptrace.h> for struct
// pt_regs (its userspace layout is the kernel's). -type exports the record
// layouts so the decoder's tests can compare sizes with Go's, and the enums
// loader's Shape and CounterNames follow (ct_shape, ct_counter).
//go:generate go tool bpf2go -tags linux -target amd64 -type ct_event -type ct_alloc_event -type ct_ustack -type ct_pyframe -type ct_pytrailer -type ct_pycode -type ct_dlobjs -type ct_dlobj -type ct_exec_note -type ct_shape -type ct_counter Cudatrace cudatrace.bpf.c -- -O2 -g -Wall -Werror -I./headers -I/usr/include/x86_64-linux-gnu
