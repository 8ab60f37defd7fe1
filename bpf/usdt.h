// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// PyTorch's USDT probes (pytorch:malloc, pytorch:free): tensor-level events.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_USDT_H
#define CT_USDT_H

CT_MAP(BPF_MAP_TYPE_ARRAY, usdt_specs, __u32, struct ct_usdt_spec, CT_USDT_MAX_SPECS); // key: the attach cookie


// usdt_arg fetches one USDT argument as its spec says, truncated to its
// size and sign-extended when signed.
static __always_inline __u64 usdt_arg(struct pt_regs *ctx, const struct ct_usdt_arg *a)
{
	__u64 v = 0, base = 0;

	switch (a->kind) {
	case CT_USDT_ARG_CONST:
		v = (__u64)a->val;
		break;
	case CT_USDT_ARG_REG:
		bpf_probe_read_kernel(&v, sizeof(v), (void *)ctx + (a->reg_off & 0xff));
		break;
	case CT_USDT_ARG_MEM:
		bpf_probe_read_kernel(&base, sizeof(base), (void *)ctx + (a->reg_off & 0xff));
		bpf_probe_read_user(&v, sizeof(v), (void *)(base + a->val));
		break;
	default:
		return 0;
	}
	int size = a->size < 0 ? -a->size : a->size;
	if (size > 0 && size < 8) {
		int shift = 64 - 8 * size;
		v <<= shift;
		v = a->size < 0 ? (__u64)((__s64)v >> shift) : v >> shift;
	}
	return v;
}

// PyTorch's caching allocator: pytorch:malloc(ptr, device, size, stream)
// when a tensor gets memory, pytorch:free(ptr) when it gives it back. These
// are tensor-level events, beside the segments cudaMalloc makes.
static __always_inline int usdt(struct pt_regs *ctx, const int use_loop)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ct_thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (!thread_traced(t, id >> 32))
		return 0;
	if (!t)
		t = thread_get(tid, NULL); // its first traced call (NULL: the map is full)
	__u32 key = (__u32)bpf_get_attach_cookie(ctx);
	struct ct_usdt_spec *spec = bpf_map_lookup_elem(&usdt_specs, &key);
	if (!spec)
		return 0;
	__u64 ptr = usdt_arg(ctx, &spec->args[0]);
	if (spec->is_free) {
		submit_entry(id, bpf_ktime_get_boot_ns(), spec->api, ptr, 0, thread_device(t), t);
		return 0;
	}
	__u64 now = bpf_ktime_get_boot_ns();
	struct py_walked pw = walk_python(ctx, id, use_loop);
	__u64 size = usdt_arg(ctx, &spec->args[2]);
	__s32 dev = (__s32)usdt_arg(ctx, &spec->args[1]);
	if (uw_small()) { // unwound here, built in the CPU's nowindow entry: see alloc.h
		__u64 seq = 0;
		struct nowindow_val *v = nowindow_fill(&seq);
		if (!v) {
			count(CT_CNT_RB_FULL);
			return 0;
		}
		fill_event(&v->r.h, id, now, 0, spec->api, CT_F_ENTRY_ONLY, ptr, size, dev, 0);
		submit_unwound(ctx, v, seq, pw, t);
		return 0;
	}
	struct ct_alloc_event *e = NULL;
	if (!nowindow_ok() || !ring_behind()) // see alloc.h
		e = reserve_alloc();
	if (!e) {
		__u64 seq = 0;
		struct nowindow_val *v = nowindow_fill(&seq); // a burst: see alloc.h
		if (!v) {
			count(CT_CNT_RB_FULL);
			return 0;
		}
		fill_event(&v->r.h, id, now, 0, spec->api, CT_F_ENTRY_ONLY, ptr, size, dev, 0);
		keep_nowindow(ctx, v, seq, pw);
		return 0;
	}
	fill_event(&e->h, id, now, 0, spec->api, CT_F_ENTRY_ONLY, ptr, size, dev, 0);
	// The probe sits in the allocator's function body, past its prologue:
	// the frame-pointer chain starts at its caller's frame.
	submit_alloc(ctx, e, pw, t);
	return 0;
}

SEC("uprobe")
int ct_usdt(struct pt_regs *ctx)
{
	return usdt(ctx, 1);
}

SEC("uprobe")
int ct_usdt_noloop(struct pt_regs *ctx)
{
	return usdt(ctx, 0);
}

#endif
