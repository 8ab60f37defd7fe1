// Package bpf holds cudatrace's BPF programs and their bpf2go-generated Go
// bindings, one object per architecture: cudatrace_x86_bpfel.{go,o} for
// amd64 and cudatrace_arm64_bpfel.{go,o} for arm64, each chosen by its
// build constraint. They are committed so that `go build` needs no clang,
// for either architecture; `make generate` rebuilds both and CI checks
// that they match the C source.
package bpf

// One bpf2go run per architecture, as the include directory differs:
// -target sets __TARGET_ARCH_* for PT_REGS_* and arch.h; <asm/ptrace.h>
// (struct pt_regs, arm64's struct user_pt_regs: the uprobe context's
// userspace layout is the kernel's) comes from the host's headers for
// amd64 and from Debian's linux-libc-dev-arm64-cross for arm64, which
// gcc-aarch64-linux-gnu brings along (scripts/deps.sh). -type exports the
// record layouts so the decoder's tests can compare sizes with Go's, and
// the enums loader's Shape and CounterNames follow (ct_shape, ct_counter).
//go:generate go tool bpf2go -tags linux -target amd64 -type ct_event -type ct_alloc_event -type ct_ustack -type ct_pyframe -type ct_pytrailer -type ct_pycode -type ct_dlobjs -type ct_dlobj -type ct_exec_note -type ct_uw_row -type ct_uw_bucket -type ct_uw_map -type ct_uw_proc -type ct_shape -type ct_counter -type ct_uw_cfa -type ct_uw_reg Cudatrace cudatrace.bpf.c -- -O2 -g -Wall -Werror -I./headers -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -tags linux -target arm64 -type ct_event -type ct_alloc_event -type ct_ustack -type ct_pyframe -type ct_pytrailer -type ct_pycode -type ct_dlobjs -type ct_dlobj -type ct_exec_note -type ct_uw_row -type ct_uw_bucket -type ct_uw_map -type ct_uw_proc -type ct_shape -type ct_counter -type ct_uw_cfa -type ct_uw_reg Cudatrace cudatrace.bpf.c -- -O2 -g -Wall -Werror -I./headers -I/usr/aarch64-linux-gnu/include
