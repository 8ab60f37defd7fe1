// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The user stack of an allocation: the frame-pointer walk and the window
// copied for unwinding in user space.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_STACK_H
#define CT_STACK_H

// fp_stack walks the frame-pointer chain from the registers at a return
// probe (ip, fp): the interrupted instruction first, then each frame's return
// address. bpf_get_stack(BPF_F_USER_STACK) makes the same walk in the
// kernel, but cost about 5 µs a call on the 6.18 VMs here, as much as a
// uprobe trap; these reads cost too little to measure (docs/benchmarks.md).
// The chain must climb the stack: a frame pointing down or to itself is
// code without frame pointers reusing rbp, and the walk stops there.
static __always_inline __s32 fp_stack(__u64 ip, __u64 fp, __u64 *stack, const __s32 max)
{
	__u64 ra = ct_ra_mask(); // arm64: the return addresses' PAC bits off
	__s32 n = 1;

	stack[0] = ip;
	for (; n < max; n++) {
		__u64 frame[2]; // the caller's rbp, the return address
		if (fp == 0)
			break;
		if (bpf_probe_read_user(frame, sizeof(frame), (void *)fp)) {
			count(CT_CNT_STACK_ERR);
			break;
		}
		stack[n] = frame[1] & ra;
		if (frame[0] <= fp) {
			n++;
			break;
		}
		fp = frame[0];
	}
	return n;
}

// user_stack is fp_stack from the registers at a probe.
static __always_inline __s32 user_stack(struct pt_regs *ctx, __u64 *stack, const __s32 max)
{
	return fp_stack(PT_REGS_IP(ctx), PT_REGS_FP(ctx), stack, max);
}

// window_size is stack_window made safe for the verifier: a whole number of
// pages, at most CT_MAX_WINDOW.
static __always_inline __u32 window_size(void)
{
	__u32 w = stack_window;
	if (w > CT_MAX_WINDOW)
		w = CT_MAX_WINDOW;
	return w & ~(CT_PAGE - 1);
}

// alloc_record_size is what an allocation record is reserved at: every
// frame slot, the registers and window when a window is copied, and room
// for the Python frames behind the most of both.
static __always_inline __u32 alloc_record_size(void)
{
	__u32 w = window_size();
	return sizeof(struct ct_alloc_event) + (w ? sizeof(struct ct_ustack) + CT_USTACK_EXTRA + w : 0) + CT_PY_BLOCK;
}

// stack_end is where the calling thread's stack ends, when that is less
// than w bytes above sp; 0 otherwise. No frame lies above it, and nothing
// there helps an unwind:
//   - the main thread's stack ends at the stack pointer the program was
//     entered with (mm->start_stack: argc, then argv, the environment and
//     the auxiliary vector up to the mapping's end), where _start's frame
//     begins: 8 bytes above it covers that;
//   - a thread's stack, made by glibc (or musl), ends below its thread
//     pointer (fsbase on x86-64, tpidr_el0 on arm64: arch.h): the thread
//     descriptor and its static TLS are put at the top of the stack's block.
// Where a shallow main thread's window ran past the mapping's end, the
// read of the whole window faulted, and the page-by-page read after it
// cost as much again as the copy (docs/benchmarks.md); a thread's ran on
// into whatever was mapped next.
static __always_inline __u64 stack_end(__u64 sp, __u32 w)
{
	struct task_struct *t = (void *)bpf_get_current_task();
	__u64 end = BPF_CORE_READ(t, mm, start_stack) + 8;
	if (end > sp && end - sp < w)
		return end;
	end = ct_thread_pointer(t);
	if (end > sp && end - sp < w)
		return end;
	return 0;
}

// user_window puts the registers and up to window_size() bytes of user stack
// from sp up right after the record's nframes frames, and flags the record:
// up to the stack's end where that lies within the window (stack_end). One
// read takes the whole window; where it fails, the stack ends inside it
// where stack_end did not see (a thread made otherwise than by glibc, up
// against a guard page or an unmapped page) and a page-by-page read keeps
// what lies below the first unreadable page.
//
// The page-by-page copy is written so that every bound is one the verifier
// of Linux 5.15 to 6.x proves without following a running length: page k
// (k a constant, the loop unrolled) lands at first + (k-1)*CT_PAGE, where
// first (the bytes to the end of sp's page) is 1..CT_PAGE, and it is copied
// only if k+1 whole pages fit the window, a test of two constants that the
// verifier settles at load. An earlier loop that added CT_PAGE to a length
// and stopped at `len > w - CT_PAGE` was accepted by 6.12 but not by 6.1 for
// windows of 8 KiB and up: 6.1's verifier also walks the branch the test
// rules out, on a range it cannot see is empty (umin=12289 umax=12288), and
// rejected the copy there (invalid access to memory, off=16496 size=4096).
static __always_inline void user_window(struct pt_regs *ctx, struct ct_alloc_event *e)
{
	const __u32 w = window_size();
	if (!w)
		return;
	__u32 n = (__u32)e->h.nframes & 127; // user_stack gives 1..CT_MAX_FRAMES
	struct ct_ustack *u = (void *)e->stack + n * 8;
	__u8 *data = (void *)(u + 1) + CT_USTACK_EXTRA;
	__u64 sp = PT_REGS_SP(ctx);
	__u32 len = 0;

	u->ip = PT_REGS_IP(ctx);
	u->sp = sp;
	u->bp = PT_REGS_FP(ctx);
	ct_ustack_extra(ctx, &e->h, u + 1);
	__u64 end = stack_end(sp, w);
	__u32 want = end ? (__u32)(end - sp) : w;
	if (want > w) // never: but the verifier must see that it fits
		want = w;
	if (bpf_probe_read_user(data, want, (void *)sp) == 0) {
		len = want;
	} else {
		__u32 first = CT_PAGE - (__u32)(sp & (CT_PAGE - 1)); // to the end of sp's page: 1..CT_PAGE
		if (bpf_probe_read_user(data, first, (void *)sp) == 0) {
			len = first;
#pragma unroll
			for (__u32 k = 1; k < CT_MAX_WINDOW / CT_PAGE; k++) {
				if ((k + 1) * CT_PAGE > w)
					break; // page k might not fit behind a whole first page
				__u32 off = first + (k - 1) * CT_PAGE;
				if (bpf_probe_read_user(data + off, CT_PAGE, (void *)(sp + off)))
					break;
				len = off + CT_PAGE;
			}
		}
	}
	u->len = len;
	u->pad = 0;
	e->h.flags |= CT_F_WINDOW;
}

// record_used is the bytes of an allocation record in use after
// user_stack and user_window: the header, the frames, and the registers
// and window copied (the Python frames go right after them). It reads the
// counts back from the record: one number the verifier does not know, for
// every path through user_window (each page read is a path of its own,
// with a length of its own, and py_stack checked on each of them took the
// verifier past its million instructions).
static __always_inline __u32 record_used(struct ct_alloc_event *e)
{
	const __u32 w = window_size();
	__u32 n = *(volatile __u32 *)&e->h.nframes & 127;
	__u32 used = sizeof(struct ct_event) + n * 8;
	if (!w)
		return used;
	__u32 len = *(volatile __u32 *)&((struct ct_ustack *)((void *)e->stack + n * 8))->len;
	if (len > w) // never: but the verifier must see that what follows fits
		len = w;
	return used + sizeof(struct ct_ustack) + CT_USTACK_EXTRA + len;
}

#endif
