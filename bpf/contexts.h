// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The driver's contexts: which device a thread allocates on.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_CONTEXTS_H
#define CT_CONTEXTS_H

// The driver's contexts, each to the device it was made for: a thread that
// makes a context current (cuCtxSetCurrent, as JAX and the runtime itself
// do) allocates on that device from then on.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64); // CUcontext
	__type(value, __s32);
} ctx_dev SEC(".maps");

// Context calls between entry and return. Apart from `inflight`: the
// runtime makes them inside its own traced calls (cudaSetDevice retains
// the primary context), and they must neither displace those nor be
// dropped as nested.
struct ctx_call {
	__u64 out;
	__u64 sp;
	__s32 device;
	__u32 make_current;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid
	__type(value, struct ctx_call);
} ctx_inflight SEC(".maps");


static __always_inline int ctx_enter(struct pt_regs *ctx, __u64 out, __s32 device, __u32 make_current)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!traced(id >> 32))
		return 0;
	struct ctx_call c = {.out = out, .sp = PT_REGS_SP(ctx), .device = device, .make_current = make_current};
	if (bpf_map_update_elem(&ctx_inflight, &tid, &c, BPF_ANY))
		count(CT_CNT_INFLIGHT_FULL);
	return 0;
}

SEC("uprobe")
int ct_ctxretain_enter(struct pt_regs *ctx)
{
	return ctx_enter(ctx, PT_REGS_PARM1(ctx), (__s32)PT_REGS_PARM2(ctx), 0);
}

SEC("uprobe")
int ct_ctxcreate_enter(struct pt_regs *ctx)
{
	return ctx_enter(ctx, PT_REGS_PARM1(ctx), (__s32)PT_REGS_PARM3(ctx), 1);
}

SEC("uretprobe")
int ct_ctx_exit(struct pt_regs *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct ctx_call *c = bpf_map_lookup_elem(&ctx_inflight, &tid);
	if (!c || PT_REGS_SP(ctx) != c->sp + 8)
		return 0;
	__u64 handle = 0;
	if ((__s32)PT_REGS_RC(ctx) == 0 && bpf_probe_read_user(&handle, sizeof(handle), (void *)c->out) == 0 &&
	    handle != 0) {
		__s32 dev = c->device;
		bpf_map_update_elem(&ctx_dev, &handle, &dev, BPF_ANY);
		if (c->make_current)
			bpf_map_update_elem(&thread_dev, &tid, &dev, BPF_ANY);
	}
	bpf_map_delete_elem(&ctx_inflight, &tid);
	return 0;
}

// make_current: the thread's device becomes the context's, when the
// context's making was seen.
static __always_inline void make_current(__u32 tid, __u64 handle)
{
	__s32 *dev = bpf_map_lookup_elem(&ctx_dev, &handle);
	if (dev) {
		__s32 d = *dev;
		bpf_map_update_elem(&thread_dev, &tid, &d, BPF_ANY);
	}
}

// cuCtxSetCurrent. Taken at entry: it fails only on a context that was
// never made.
SEC("uprobe")
int ct_ctxset_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!traced(id >> 32))
		return 0;
	make_current((__u32)id, PT_REGS_PARM1(ctx));
	return 0;
}

// Each thread's context stack, as devices: cuCtxPushCurrent saves the
// device current before it, cuCtxPopCurrent brings it back. Deeper than
// CT_CTX_STACK, pushes are counted but not saved, and their pops leave the
// device as it is.
#define CT_CTX_STACK 8

struct ctx_stack {
	__u32 depth;
	__s32 dev[CT_CTX_STACK];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid
	__type(value, struct ctx_stack);
} ctx_stacks SEC(".maps");

SEC("uprobe")
int ct_ctxpush_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!traced(id >> 32))
		return 0;
	struct ctx_stack *st = bpf_map_lookup_elem(&ctx_stacks, &tid);
	if (!st) {
		struct ctx_stack empty = {};
		bpf_map_update_elem(&ctx_stacks, &tid, &empty, BPF_NOEXIST);
		st = bpf_map_lookup_elem(&ctx_stacks, &tid);
		if (!st)
			return 0;
	}
	__u32 d = st->depth;
	if (d < CT_CTX_STACK)
		st->dev[d & (CT_CTX_STACK - 1)] = current_device(tid);
	st->depth = d + 1;
	make_current(tid, PT_REGS_PARM1(ctx));
	return 0;
}

SEC("uprobe")
int ct_ctxpop_enter(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (!traced(id >> 32))
		return 0;
	struct ctx_stack *st = bpf_map_lookup_elem(&ctx_stacks, &tid);
	if (!st || st->depth == 0)
		return 0;
	__u32 d = st->depth - 1;
	st->depth = d;
	if (d < CT_CTX_STACK) {
		__s32 dev = st->dev[d & (CT_CTX_STACK - 1)];
		bpf_map_update_elem(&thread_dev, &tid, &dev, BPF_ANY);
	}
	return 0;
}

#endif
