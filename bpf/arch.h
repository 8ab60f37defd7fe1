// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What differs between the architectures the programs are built for:
// bpf2go builds cudatrace.bpf.c once per target (bpf/gen.go), defining
// __TARGET_ARCH_x86 or __TARGET_ARCH_arm64, which also picks the PT_REGS_*
// macros of bpf_tracing.h. Everything else in bpf/ is the same on both.
// Part of cudatrace.bpf.c, the one program file, which includes it before
// common.h (whose task_struct holds this file's thread_struct).
#ifndef CT_ARCH_H
#define CT_ARCH_H

// The most bytes struct pthread takes below an arm64 thread's thread
// pointer (see ct_py_id_is): glibc 2.36's is 1856.
#define CT_PTHREAD_MAX 4096

#if defined(__TARGET_ARCH_x86)

// The thread pointer: fsbase, which glibc points at the thread's struct
// pthread (TLS_TCB_AT_TP), at the top of its stack's block.
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

#define ct_thread_pointer(t) BPF_CORE_READ((t), thread.fsbase)

// At a return probe the stack pointer is this far above its value at the
// call's entry: `ret` pops the return address that `call` pushed.
#define CT_RET_SP_DELTA 8

// Where a by-value argument of more than 16 bytes (cudaMalloc3D's
// struct cudaExtent) lies at entry: in memory just above the return address.
#define ct_byval_arg2(ctx) (PT_REGS_SP(ctx) + 8)

// Bytes a stack window's registers take after struct ct_ustack: none.
#define CT_USTACK_EXTRA 0

static __always_inline void ct_ustack_extra(struct pt_regs *ctx, struct ct_event *h, void *extra)
{
}

// Return addresses are plain addresses: ct_ra_mask keeps them whole.
static __always_inline __u64 ct_ra_mask(void)
{
	return ~0ULL;
}

// ct_uw_lr gives an unwind's first frame the link register: x86-64 has
// none.
static __always_inline void ct_uw_lr(struct pt_regs *ctx, int entry, __u64 *lr, __u32 *ok)
{
	*lr = 0;
	*ok = 0;
}

// ct_py_id_is says whether id, a thread state's thread id, is the one
// wanted: 3.11's and later's native_thread_id, the thread's tid; 3.10's
// thread_id, pthread_self(), the thread pointer itself on x86-64.
static __always_inline int ct_py_id_is(__u64 id, __u64 want, __u32 minor)
{
	return id == want;
}

#elif defined(__TARGET_ARCH_arm64)

// The thread pointer: tpidr_el0 as the kernel saves it. glibc puts struct
// pthread right below it (TLS_DTV_AT_TP: the static TLS lies above), at
// the top of the stack's block, so the stack ends below it too.
struct thread_struct {
	struct {
		unsigned long tp_value;
	} uw;
} __attribute__((preserve_access_index));

#define ct_thread_pointer(t) BPF_CORE_READ((t), thread.uw.tp_value)

// `ret` pops nothing: the stack pointer at return is the one at entry.
#define CT_RET_SP_DELTA 0

// AAPCS64 passes a composite of more than 16 bytes by reference: x1 holds
// the address of cudaMalloc3D's struct cudaExtent.
#define ct_byval_arg2(ctx) PT_REGS_PARM2(ctx)

// A stack window's registers carry x30 (the link register) after struct
// ct_ustack, flagged CT_F_LR: at a probe inside a function (USDT) that has
// not saved it yet, it is the only place the return address is. At a
// return probe it holds the uretprobe trampoline's address, not a return
// address: 0 there, unknown.
#define CT_USTACK_EXTRA 8

static __always_inline void ct_ustack_extra(struct pt_regs *ctx, struct ct_event *h, void *extra)
{
	*(__u64 *)extra = (h->flags & CT_F_ENTRY_ONLY) ? PT_REGS_RET(ctx) : 0;
	h->flags |= CT_F_LR;
}

// Only the fields read here; CO-RE finds them in the running kernel's BTF
// (a flavor of common.h's mm_struct: CO-RE ignores the ___arch suffix).
struct mm_struct___arch {
	unsigned long task_size; // 1 << the user address space's bits
} __attribute__((preserve_access_index));

struct task_struct___arch {
	struct mm_struct___arch *mm;
} __attribute__((preserve_access_index));

// ct_ra_mask keeps of a return address saved with pointer authentication
// (-mbranch-protection=standard: Debian's and Ubuntu's arm64 userlands)
// its address alone: the code sits in the bits from the address space's
// size up to 54 (48-54 with 48-bit addresses, 52-54 with 52-bit ones),
// and bits 56-63 are the ignored top byte. An unsigned one loses nothing.
// Read through the kernel's BTF (bpf_get_current_task_btf): two loads,
// no helper call and no stack for BPF_CORE_READ's copies (ct_keep_nowindow's
// frame, with ct_usdt's, came to 544 bytes with them on 6.1).
static __always_inline __u64 ct_ra_mask(void)
{
	struct task_struct___arch *t = (void *)bpf_get_current_task_btf();
	__u64 size = t->mm->task_size;
	return size ? size - 1 : ~0ULL;
}

// ct_uw_lr gives an unwind's first frame the link register, where it is
// the frame's return address until the function saves it: at a probe
// inside a function (USDT, entry); at a return probe it holds the
// uretprobe trampoline's address, unknown (as ct_ustack_extra writes it).
static __always_inline void ct_uw_lr(struct pt_regs *ctx, int entry, __u64 *lr, __u32 *ok)
{
	*lr = entry ? PT_REGS_RET(ctx) : 0;
	*ok = *lr != 0;
}

// 3.10's thread_id is pthread_self(): on arm64 the struct pthread right
// below the thread pointer (want), whose size differs between glibc
// releases. Another thread's lies a stack away (arm64's smallest is 128
// KiB), so the one within CT_PTHREAD_MAX below the thread pointer is this
// thread's.
static __always_inline int ct_py_id_is(__u64 id, __u64 want, __u32 minor)
{
	if (minor == 10)
		return id < want && want - id <= CT_PTHREAD_MAX;
	return id == want;
}

#else
#error "cudatrace's BPF programs are built for amd64 and arm64 (bpf2go -target)"
#endif

#endif
