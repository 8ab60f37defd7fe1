// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The driver's contexts: which device a thread allocates on.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_CONTEXTS_H
#define CT_CONTEXTS_H

// A context, by process and handle: a CUcontext is a pointer into its
// process, and two processes can hold the same value (ranks of one program
// with address randomization off; a driver that hands out handles from a
// fixed arena), each for its own device and usage count.
struct ctx_key {
	__u32 tgid;
	__u32 pad;
	__u64 handle;
};

// The driver's contexts, each to the device it was made for: a thread that
// makes a context current (cuCtxSetCurrent, as JAX and the runtime itself
// do) allocates on that device from then on. A process's entries outlive
// it until the reader's sweep (loader Tracer.Sweep) or the LRU takes them:
// a later process with its PID makes its contexts before it uses them.
CT_MAP(BPF_MAP_TYPE_LRU_HASH, ctx_dev, struct ctx_key, __s32, 4096);

// Created contexts' usage counts (cuCtxCreate: 1, cuCtxAttach: one more,
// cuCtxDetach: one less; at 0 the context dies).
CT_MAP(BPF_MAP_TYPE_LRU_HASH, ctx_refs, struct ctx_key, __s32, 4096);

static __always_inline struct ctx_key ctx_key_of(__u64 id, __u64 handle)
{
	struct ctx_key k = {.tgid = id >> 32, .handle = handle};
	return k;
}

// Primary contexts per process and device: the handle and the retain count
// (cuDevicePrimaryCtxRetain adds one, Release takes one away; at 0, or at
// a Reset, what was allocated in it is freed).
struct primary_key {
	__u32 tgid;
	__s32 dev;
};

struct primary_val {
	__u64 handle;
	__s32 refs;
	__u32 pad;
};

CT_MAP(BPF_MAP_TYPE_LRU_HASH, primaries, struct primary_key, struct primary_val, 4096);

// Each thread's context stack, as the driver keeps it: its top is the
// current context. Deeper than CT_CTX_STACK, pushes are counted but not
// saved, and their pops leave the device as it is.
#define CT_CTX_STACK 8

struct ctx_stack {
	__u32 depth;
	// The depth at the entry of the thread's last cuCtxPopCurrent, set by
	// ct_ctxpop_enter: 0 there, its return (ct_learn_exit) learns what it
	// popped.
	__u32 pop_depth;
	__u64 ctx[CT_CTX_STACK];
};

CT_MAP(BPF_MAP_TYPE_LRU_HASH, ctx_stacks, __u32, struct ctx_stack, 16384); // key: tid

static __always_inline struct ctx_stack *ctx_stack_of(__u32 tid)
{
	struct ctx_stack *st = bpf_map_lookup_elem(&ctx_stacks, &tid);
	if (st)
		return st;
	struct ctx_stack empty = {};
	bpf_map_update_elem(&ctx_stacks, &tid, &empty, BPF_NOEXIST);
	return bpf_map_lookup_elem(&ctx_stacks, &tid);
}

// traced_ctx_stack is the context programs' prologue: the calling thread
// (*id: bpf_get_current_pid_tgid) and its context stack, made when absent
// if make is set; NULL when its process is not traced or it has none.
static __always_inline struct ctx_stack *traced_ctx_stack(__u64 *id, const int make)
{
	*id = bpf_get_current_pid_tgid();
	if (!traced(*id >> 32))
		return NULL;
	__u32 tid = (__u32)*id;
	return make ? ctx_stack_of(tid) : bpf_map_lookup_elem(&ctx_stacks, &tid);
}

// top: the thread's current context, 0 when the stack is empty or its top
// lies deeper than what is kept.
static __always_inline __u64 ctx_top(struct ctx_stack *st)
{
	__u32 d = st->depth;
	if (d == 0 || d > CT_CTX_STACK)
		return 0;
	return st->ctx[(d - 1) & (CT_CTX_STACK - 1)];
}

static __always_inline __s32 ctx_device(__u64 id, __u64 handle)
{
	struct ctx_key k = ctx_key_of(id, handle);
	__s32 *dev = bpf_map_lookup_elem(&ctx_dev, &k);
	return dev ? *dev : -1;
}

// follow_top: the thread's device becomes its current context's, when the
// context's device is known. A context made before tracing began (its
// device unknown) made current by a thread that ran before then leaves
// that thread's device unknown until its own calls tell it (ct_learn_exit).
static __always_inline void follow_top(__u32 tid, struct ctx_stack *st)
{
	__u64 top = ctx_top(st);
	if (!top)
		return;
	struct ctx_key k = ctx_key_of(bpf_get_current_pid_tgid(), top);
	__s32 *dev = bpf_map_lookup_elem(&ctx_dev, &k);
	__s32 d;
	if (dev)
		d = *dev;
	else if (started_before_tracing())
		d = CT_DEV_UNKNOWN;
	else
		return;
	set_device(tid, d);
}

static __always_inline void ctx_push(__u32 tid, struct ctx_stack *st, __u64 handle)
{
	__u32 d = st->depth;
	if (d < CT_CTX_STACK)
		st->ctx[d & (CT_CTX_STACK - 1)] = handle;
	st->depth = d + 1;
	follow_top(tid, st);
}

static __always_inline void ctx_pop(__u32 tid, struct ctx_stack *st)
{
	if (st->depth == 0)
		return;
	st->depth--;
	follow_top(tid, st);
}

// ctx_record tells the ledger about a context call: which context it is
// about (addr: the one made current, or the one that died, with its
// device) and the thread's current context after it (size). The ledger
// keeps, per thread, the context allocations are made in, and frees a dead
// context's allocations (implicit frees).
static __always_inline void ctx_record(struct pt_regs *ctx, __u64 id, __u64 handle, __s32 dev, __u64 after)
{
	submit_entry(id, bpf_ktime_get_boot_ns(), (__u16)bpf_get_attach_cookie(ctx), handle, after, dev, NULL);
}

// Context calls between entry and return. Apart from `inflight`: the
// runtime makes them inside its own traced calls (cudaSetDevice retains
// the primary context), and they must neither displace those nor be
// dropped as nested.
struct ctx_call {
	__u64 out;
	__u64 sp;
	__s32 device;
	__u32 make_current; // the learning calls (ct_learn_*): their shape
};

CT_MAP(BPF_MAP_TYPE_HASH, ctx_inflight, __u32, struct ctx_call, 16384); // key: tid


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

// The return of cuDevicePrimaryCtxRetain (counted: one retain more) and of
// cuCtxCreate (usage count 1, pushed on the thread's stack).
SEC("uretprobe")
int ct_ctx_exit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ctx_call *c = bpf_map_lookup_elem(&ctx_inflight, &tid);
	if (!c || PT_REGS_SP(ctx) != c->sp + CT_RET_SP_DELTA)
		return 0;
	__u64 handle = 0;
	__s32 dev = c->device;
	__u32 create = c->make_current;
	int ok = (__s32)PT_REGS_RC(ctx) == 0 && bpf_probe_read_user(&handle, sizeof(handle), (void *)c->out) == 0 &&
		 handle != 0;
	bpf_map_delete_elem(&ctx_inflight, &tid);
	if (!ok)
		return 0;
	struct ctx_key ck = ctx_key_of(id, handle);
	bpf_map_update_elem(&ctx_dev, &ck, &dev, BPF_ANY);
	if (!create) {
		struct primary_key k = {.tgid = id >> 32, .dev = dev};
		struct primary_val *p = bpf_map_lookup_elem(&primaries, &k);
		if (p) {
			p->handle = handle;
			p->refs++;
		} else {
			struct primary_val v = {.handle = handle, .refs = 1};
			bpf_map_update_elem(&primaries, &k, &v, BPF_ANY);
		}
		struct ctx_stack *st = ctx_stack_of(tid);
		ctx_record(ctx, id, handle, dev, st ? ctx_top(st) : 0);
		return 0;
	}
	__s32 one = 1;
	bpf_map_update_elem(&ctx_refs, &ck, &one, BPF_ANY);
	struct ctx_stack *st = ctx_stack_of(tid);
	if (!st)
		return 0;
	ctx_push(tid, st, handle);
	ctx_record(ctx, id, handle, dev, handle);
	return 0;
}

// ctx_change: cuCtxSetCurrent (push 0) replaces the top of the thread's
// stack (pushes onto an empty one), NULL pops; cuCtxPushCurrent (push 1)
// pushes. Taken at entry: they fail only on a context that was never made.
// The record names the context pushed, or the new top.
static __always_inline int ctx_change(struct pt_regs *ctx, const int push)
{
	__u64 id;
	struct ctx_stack *st = traced_ctx_stack(&id, 1);
	if (!st)
		return 0;
	__u32 tid = (__u32)id;
	__u64 handle = PT_REGS_PARM1(ctx);
	if (push || (handle != 0 && st->depth == 0)) {
		ctx_push(tid, st, handle);
	} else if (handle == 0) {
		ctx_pop(tid, st);
	} else {
		__u32 d = st->depth;
		if (d <= CT_CTX_STACK)
			st->ctx[(d - 1) & (CT_CTX_STACK - 1)] = handle;
		follow_top(tid, st);
	}
	__u64 top = ctx_top(st);
	__u64 named = push ? handle : top;
	ctx_record(ctx, id, named, ctx_device(id, named), top);
	return 0;
}

SEC("uprobe")
int ct_ctxset_enter(struct pt_regs *ctx)
{
	return ctx_change(ctx, 0);
}

SEC("uprobe")
int ct_ctxpush_enter(struct pt_regs *ctx)
{
	return ctx_change(ctx, 1);
}

SEC("uprobe")
int ct_ctxpop_enter(struct pt_regs *ctx)
{
	__u64 id;
	struct ctx_stack *st = traced_ctx_stack(&id, 1);
	if (!st)
		return 0;
	st->pop_depth = st->depth;
	if (st->depth == 0)
		return 0; // a context made current unseen, or none: ct_learn_exit
	__u32 tid = (__u32)id;
	ctx_pop(tid, st);
	__u64 top = ctx_top(st);
	ctx_record(ctx, id, top, ctx_device(id, top), top);
	return 0;
}

// cuCtxAttach: one use more of the thread's current context.
SEC("uprobe")
int ct_ctxattach_enter(struct pt_regs *ctx)
{
	__u64 id;
	struct ctx_stack *st = traced_ctx_stack(&id, 0);
	if (!st)
		return 0;
	struct ctx_key k = ctx_key_of(id, ctx_top(st));
	__s32 *refs = bpf_map_lookup_elem(&ctx_refs, &k);
	if (refs)
		__sync_fetch_and_add(refs, 1);
	return 0;
}

// ctx_dies: handle is destroyed. It is popped from the calling thread's
// stack if current there (other threads' stacks keep a dead handle, as the
// driver's do), and the ledger frees what was allocated in it.
static __always_inline int ctx_dies(struct pt_regs *ctx, __u64 id, __u64 handle)
{
	__u32 tid = (__u32)id;
	__s32 dev = ctx_device(id, handle);
	struct ctx_key k = ctx_key_of(id, handle);
	bpf_map_delete_elem(&ctx_refs, &k);
	struct ctx_stack *st = bpf_map_lookup_elem(&ctx_stacks, &tid);
	__u64 top = 0;
	if (st) {
		if (ctx_top(st) == handle)
			ctx_pop(tid, st);
		top = ctx_top(st);
	}
	ctx_record(ctx, id, handle, dev, top);
	return 0;
}

// ending_ctx is the prologue of cuCtxDestroy and cuCtxDetach: the context
// they end, and the calling thread (*id); 0 when the process is not traced
// or the handle is NULL.
static __always_inline __u64 ending_ctx(struct pt_regs *ctx, __u64 *id)
{
	*id = bpf_get_current_pid_tgid();
	if (!traced(*id >> 32))
		return 0;
	return PT_REGS_PARM1(ctx);
}

// cuCtxDestroy: the context dies whatever its usage count.
SEC("uprobe")
int ct_ctxdestroy_enter(struct pt_regs *ctx)
{
	__u64 id;
	__u64 handle = ending_ctx(ctx, &id);
	return handle ? ctx_dies(ctx, id, handle) : 0;
}

// cuCtxDetach: one use less; the context dies at 0, or when its making
// was not seen (made before tracing: PyCUDA detaches what it created).
SEC("uprobe")
int ct_ctxdetach_enter(struct pt_regs *ctx)
{
	__u64 id;
	__u64 handle = ending_ctx(ctx, &id);
	if (!handle)
		return 0;
	struct ctx_key k = ctx_key_of(id, handle);
	__s32 *refs = bpf_map_lookup_elem(&ctx_refs, &k);
	if (refs) {
		// Not atomic (the v1 instruction set has no fetch-and-add with a
		// result): two threads detaching one context at once may miscount.
		__s32 left = *refs - 1;
		*refs = left;
		if (left > 0)
			return 0;
	}
	return ctx_dies(ctx, id, handle);
}

// primary_drop: cuDevicePrimaryCtxRelease (reset == 0: one retain less) and
// cuDevicePrimaryCtxReset or the runtime's cudaDeviceReset (reset: the
// primary context's memory goes now). The record names the primary
// context where its retain was seen, else 0, and the device.
static __always_inline int primary_drop(struct pt_regs *ctx, __s32 dev, int reset)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!traced(id >> 32))
		return 0;
	struct primary_key k = {.tgid = id >> 32, .dev = dev};
	struct primary_val *p = bpf_map_lookup_elem(&primaries, &k);
	__u64 handle = 0;
	if (p) {
		handle = p->handle;
		__s32 left = reset ? 0 : p->refs - 1;
		p->refs = left > 0 ? left : 0;
		if (left > 0)
			return 0;
	} else if (!reset) {
		return 0; // retained before tracing: its count is unknown
	}
	__u32 tid = (__u32)id;
	struct ctx_stack *st = bpf_map_lookup_elem(&ctx_stacks, &tid);
	ctx_record(ctx, id, handle, dev, st ? ctx_top(st) : 0);
	return 0;
}

SEC("uprobe")
int ct_primary_release_enter(struct pt_regs *ctx)
{
	return primary_drop(ctx, (__s32)PT_REGS_PARM1(ctx), 0);
}

SEC("uprobe")
int ct_primary_reset_enter(struct pt_regs *ctx)
{
	return primary_drop(ctx, (__s32)PT_REGS_PARM1(ctx), 1);
}

SEC("uprobe")
int ct_devreset_enter(struct pt_regs *ctx)
{
	return primary_drop(ctx, current_device((__u32)bpf_get_current_pid_tgid()), 1);
}

// Learning what was set before tracing began. A thread that made a
// context current (or called cudaSetDevice) before then allocates on a
// device cudatrace did not see chosen: current_device says
// CT_DEV_UNKNOWN. The programs below read, at their return, what the
// thread's own calls say: cuCtxGetCurrent its current context,
// cuCtxGetDevice that context's device, cudaGetDevice the runtime's
// device (Numba asks the first two before each of its API calls; the
// runtime asks the driver on its own paths), and cuCtxPopCurrent the context
// it popped where the thread's stack was empty to us (PyCUDA's
// ctx.pop(); ctx.detach() of a context made before tracing: the detach
// then frees what the thread allocated in it). The loader attaches them only
// while some thread's device is unknown, or it has allocations in a context
// it has not named (record's session removes them once none has): the hot
// path does not pay for them.
// Between entry and return in ctx_inflight, make_current holding the shape.
static __always_inline int learn_enter(struct pt_regs *ctx, __u32 shape)
{
	return ctx_enter(ctx, PT_REGS_PARM1(ctx), 0, shape);
}

SEC("uprobe")
int ct_learn_ctx_enter(struct pt_regs *ctx)
{
	return learn_enter(ctx, CT_SHAPE_LEARN_CTX);
}

SEC("uprobe")
int ct_learn_ctxdev_enter(struct pt_regs *ctx)
{
	return learn_enter(ctx, CT_SHAPE_LEARN_CTXDEV);
}

SEC("uprobe")
int ct_learn_rtdev_enter(struct pt_regs *ctx)
{
	return learn_enter(ctx, CT_SHAPE_LEARN_RTDEV);
}

SEC("uprobe")
int ct_learn_pop_enter(struct pt_regs *ctx)
{
	return learn_enter(ctx, CT_SHAPE_LEARN_POP);
}

// learned_pop: the thread popped handle, a context current to it since
// before tracing (its stack was empty to us at the entry). What it
// allocated while that context was unnamed was made in it: the record
// names it (addr, apart from size: the current context after, 0), for the
// ledger. The context now current, the one below, is unknown.
static __always_inline int learned_pop(struct pt_regs *ctx, __u64 id, struct ctx_stack *st, __u64 handle)
{
	if (st->pop_depth != 0 || handle == 0)
		return 0; // popped one ct_ctxpop_enter knew
	__u32 tid = (__u32)id;
	__s32 dev = CT_DEV_UNKNOWN;
	st->depth = 0;
	set_device(tid, dev);
	ctx_record(ctx, id, handle, dev, 0);
	return 0;
}

// ct_learn_exit: the call succeeded; what it says becomes the thread's
// state. A record goes to the ledger only when that changed the thread's
// device or current context, or named a context it popped (learned_pop).
SEC("uretprobe")
int ct_learn_exit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ctx_call *c = bpf_map_lookup_elem(&ctx_inflight, &tid);
	if (!c || PT_REGS_SP(ctx) != c->sp + CT_RET_SP_DELTA)
		return 0;
	__u32 shape = c->make_current;
	__u64 out = c->out;
	bpf_map_delete_elem(&ctx_inflight, &tid);
	if ((__s32)PT_REGS_RC(ctx) != 0)
		return 0;
	__u64 val = 0;
	int wide = shape == CT_SHAPE_LEARN_CTX || shape == CT_SHAPE_LEARN_POP;
	if (bpf_probe_read_user(&val, wide ? 8 : 4, (void *)out))
		return 0;
	struct ctx_stack *st = ctx_stack_of(tid);
	if (!st)
		return 0;
	if (shape == CT_SHAPE_LEARN_POP)
		return learned_pop(ctx, id, st, val);
	__s32 before = current_device(tid);
	__u64 top_before = ctx_top(st);
	__s32 dev = (__s32)val;
	switch (shape) {
	case CT_SHAPE_LEARN_CTX:
		if (val == 0) { // no context current: the stack is empty
			st->depth = 0;
			break;
		}
		if (st->depth == 0)
			st->depth = 1;
		if (st->depth <= CT_CTX_STACK)
			st->ctx[(st->depth - 1) & (CT_CTX_STACK - 1)] = val;
		struct ctx_key vk = ctx_key_of(id, val);
		__s32 *known = bpf_map_lookup_elem(&ctx_dev, &vk);
		if (known) {
			dev = *known;
			set_device(tid, dev);
		}
		break;
	case CT_SHAPE_LEARN_CTXDEV:
		if (top_before) {
			struct ctx_key tk = ctx_key_of(id, top_before);
			bpf_map_update_elem(&ctx_dev, &tk, &dev, BPF_ANY);
		}
		set_device(tid, dev);
		break;
	default: // CT_SHAPE_LEARN_RTDEV
		set_device(tid, dev);
		break;
	}
	__s32 after = current_device(tid);
	__u64 top = ctx_top(st);
	if (after != before || top != top_before)
		ctx_record(ctx, id, top, after, top);
	return 0;
}

#endif
