// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Allocations and frees: entry programs remember the arguments, the return
// program makes the record; frees are recorded at entry.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_ALLOC_H
#define CT_ALLOC_H

#define CT_NESTED_FREE_NS 1000000


// remember stores the call's arguments for the return probe. A call made
// while another traced call of the same thread is under way (cudaMallocHost
// calling cudaHostAlloc inside the library) is nested: the outer one is the
// call the application made, so the inner one is left out.
static __always_inline int remember(struct pt_regs *ctx, __u16 shape, __u64 out, __u64 size,
				    __u64 aux1, __u64 aux2)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct ct_thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (!thread_traced(t, tgid))
		return 0;

	__u64 sp = PT_REGS_SP(ctx);
	struct inflight *cur = t ? &t->call : NULL;
	if (cur && cur->sp) {
		if (sp < cur->sp) { // deeper in the same thread's stack: nested
			count(CT_CNT_NESTED);
			return 0;
		}
		count(CT_CNT_STALE); // the earlier call never returned through us
	}

	struct inflight in = {
		.ts_ns = bpf_ktime_get_boot_ns(),
		.sp = sp,
		.out = out,
		.size = size,
		.aux1 = aux1,
		.aux2 = aux2,
		.api = (__u16)bpf_get_attach_cookie(ctx),
		.shape = shape,
		// cuMemCreate says its device; every other call uses the thread's,
		// looked up at the return (alloc_exit): a call cannot change its
		// thread's device, only show it (the runtime's own context calls,
		// ct_learn_exit), and one lookup a call costs less than two.
		.device = shape == CT_SHAPE_VMM_CREATE ? (__s32)aux1 : CT_DEV_UNKNOWN,
	};
	if (cur)
		*cur = in; // only this thread writes or reads its entry
	else if (!thread_get(tid, &in)) // its first call
		count(CT_CNT_INFLIGHT_FULL);
	return 0;
}

// call_done ends a thread's call in its inflight entry, kept for its next.
static __always_inline void call_done(struct inflight *in)
{
	in->sp = 0;
}

SEC("uprobe")
int ct_alloc_enter(struct pt_regs *ctx)
{
	return remember(ctx, CT_SHAPE_ALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0);
}

SEC("uprobe")
int ct_pitch_enter(struct pt_regs *ctx)
{
	return remember(ctx, CT_SHAPE_PITCH, PT_REGS_PARM1(ctx), PT_REGS_PARM3(ctx),
			PT_REGS_PARM2(ctx), PT_REGS_PARM4(ctx));
}

// cudaMalloc3D(struct cudaPitchedPtr *out, struct cudaExtent extent): the
// 24-byte extent is passed in memory (ct_byval_arg2: above the return
// address on x86-64, by reference on arm64).
SEC("uprobe")
int ct_3d_enter(struct pt_regs *ctx)
{
	__u64 ext[3] = {}; // width, height, depth
	bpf_probe_read_user(ext, sizeof(ext), (void *)ct_byval_arg2(ctx));
	return remember(ctx, CT_SHAPE_3D, PT_REGS_PARM1(ctx), ext[0], ext[1], ext[2]);
}

// cuMemCreate's CUmemAllocationProp: type (int), requestedHandleTypes (int),
// then location {type, id}. Physical memory on a device has location type 1
// (CU_MEM_LOCATION_TYPE_DEVICE), and id is the device ordinal.
SEC("uprobe")
int ct_vmm_create_enter(struct pt_regs *ctx)
{
	__s32 loc[2] = {}; // location.type, location.id
	bpf_probe_read_user(loc, sizeof(loc), (void *)(PT_REGS_PARM3(ctx) + 8));
	__s64 dev = loc[0] == 1 ? loc[1] : -1;
	return remember(ctx, CT_SHAPE_VMM_CREATE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), (__u64)dev, 0);
}

// cuMemMap(CUdeviceptr va, size_t size, size_t offset, handle, flags):
// every argument by value. The ledger ties the mapping to the handle's
// physical memory, which stays allocated while it is mapped even after
// cuMemRelease.
SEC("uprobe")
int ct_vmm_map_enter(struct pt_regs *ctx)
{
	return remember(ctx, CT_SHAPE_VMM_MAP, 0, PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx), PT_REGS_PARM4(ctx));
}

SEC("uprobe")
int ct_setdev_enter(struct pt_regs *ctx)
{
	return remember(ctx, CT_SHAPE_SETDEV, 0, 0, (__u64)(__s32)PT_REGS_PARM1(ctx), 0);
}


// submit_alloc finishes an allocation record reserved at
// alloc_record_size() whose header is filled: the stack (unwound here with
// --keep-stack-windows, else from the frame pointers), the stack window,
// the Python frames py_walk found (pw); and submits it. t is the thread's
// entry (NULL: none in hand), for wakeup_flags.
static __always_inline void submit_alloc(struct pt_regs *ctx, struct ct_alloc_event *e, struct py_walked pw,
					 struct ct_thread *t)
{
	if (uw_mode == CT_UW_BOTH && window_size() && uw_stack(ctx, e, e->h.flags & CT_F_ENTRY_ONLY))
		e->h.flags |= CT_F_UNWOUND;
	else
		e->h.nframes = user_stack(ctx, e->stack, CT_MAX_FRAMES);
	if (*(volatile __s32 *)&e->h.nframes == CT_MAX_FRAMES)
		e->h.flags |= CT_F_STACK_TRUNC;
	// The Python frames right after what the record uses, not at the end
	// of the room reserved: the ring's memory is cold, and every cache line
	// and page a record touches beyond its frames and window costs.
	user_window(ctx, e);
	py_put(&e->h, (__u8 *)e + record_used(e), pw);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(&e->h, alloc_record_size(), t));
}

// uw_small says that allocation records are unwound here first
// (uw_mode CT_UW_ON), with a window to fall back on: built in the CPU's
// nowindow entry and copied out at their size (submit_unwound), a VMM
// mapping's reserved at small_record_size().
static __always_inline int uw_small(void)
{
	return uw_mode == CT_UW_ON && window_size();
}

// small_record_size is a record of frames alone, and its Python frames.
static __always_inline __u32 small_record_size(void)
{
	return sizeof(struct ct_alloc_event) + CT_PY_BLOCK;
}

// A record kept without its window: where the reader is behind by more
// than half the ring buffer (ring_behind), or the ring had no room for a
// record with its window (reserve_alloc failed), one without it, its
// frame-pointer frames and Python frames. An event kept with its
// frame-pointer frames is worth more than an event lost, whose absence
// would leave the ledger wrong. Its program fills the CPU's nowindow entry
// and calls ct_keep_nowindow: a global function, which the verifier checks
// once, on its own, rather than on every path of the program that calls
// it. Inlined (4eed994), the second frame-pointer walk and Python copy it
// makes took Linux 6.1's verifier under TCG (the arm64 guest) from 11 s to
// ~300 s for each return program.
struct nowindow_val {
	// The record, built here: its header filled by the caller, its
	// frames and Python frames by ct_keep_nowindow. Copied to the ring
	// buffer at the size it uses (nowindow_out), a few hundred bytes
	// where the record that copies a window is reserved at ~18 KiB.
	struct ct_alloc_event r;
	__u8 py[CT_PY_BLOCK]; // room for the Python frames behind the most frames
	__u64 ip;             // the registers the frame-pointer walk starts from
	__u64 fp;
	__u64 py_seq; // the Python walk's outcome (struct py_walked)
	__u64 py_mm;
	// Counted up before each fill: uprobe programs run preemptible, and
	// a thread that preempts another on its CPU between its fill and the
	// copy to the ring writes over the entry; the copy then is discarded.
	__u64 seq;
};

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, nowindow, __u32, struct nowindow_val, 1);

// nowindow_ok says that allocation records may copy a window, and so can
// be kept without it: from the start where the reader is behind
// (alloc_exit), and where the window finds no room (submit_alloc's
// caller, submit_small). Without a window the record that found no room
// was as small as this one.
static __always_inline int nowindow_ok(void)
{
	return window_size() != 0;
}

// ring_behind says that the reader is more than half the ring buffer
// behind: an allocation record then goes without its window from the
// start. Under a sustained burst (a loaded node, where the reader shares
// its CPUs with the job's threads) records with windows (~18 KiB) fill
// what is left of a 16 MiB ring in a few hundred records, and the ring
// stays full: a record kept without its window only where the full one
// found no room was one in hundreds, the others lost (bench/burst.sh: 151
// kept, 53582 lost). Frames alone, copied at the size they use, fit some
// hundred times more, and cost the reader less each (nothing to unwind),
// so it catches up; the ledger misses nothing.
static __always_inline int ring_behind(void)
{
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) > bpf_ringbuf_query(&events, BPF_RB_RING_SIZE) / 2;
}

// nowindow_fill starts a fill of the CPU's nowindow entry: it counts seq
// up and returns the entry, with the count (*seq) to give
// ct_keep_nowindow. NULL where windows are not copied (the record that
// found no room was as small as this one) or there is no entry.
static __always_inline struct nowindow_val *nowindow_fill(__u64 *seq)
{
	__u32 zero = 0;
	if (!nowindow_ok())
		return NULL;
	struct nowindow_val *v = bpf_map_lookup_elem(&nowindow, &zero);
	if (!v)
		return NULL;
	*seq = v->seq + 1;
	v->seq = *seq;
	barrier();
	return v;
}

// record_out copies the record built in v, used bytes of it, into a ring
// buffer record reserved at size (a constant power of two:
// bpf_ringbuf_reserve takes no other size than a constant), and submits
// it where v was not written over meanwhile (seq); t is the thread's entry
// for wakeup_flags (NULL: none in hand), nowin counts the record one kept
// without its window. It returns -1 where the record does not fit size,
// else whether it submitted it. bpf_ringbuf_output would copy at the
// exact size, but could not take back a copy that a preempting fill
// changed under it.
static __always_inline int record_out(struct nowindow_val *v, __u32 used, __u64 seq, const __u32 size,
				      struct ct_thread *t, const int nowin)
{
	if (used >= size)
		return -1;
	// A no-op (used < size, a power of two) that tells the verifier the
	// copy fits: it does not follow the test above, which the compiler
	// makes on a copy of used; behind a barrier, as the compiler would
	// drop it.
	barrier_var(used);
	used &= size - 1;
	struct ct_event *e = bpf_ringbuf_reserve(&events, size, 0);
	if (!e)
		return 0;
	bpf_probe_read_kernel(e, used, &v->r);
	barrier();
	if (*(volatile __u64 *)&v->seq != seq) {
		bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
		return 0;
	}
	if (nowin)
		count(CT_CNT_RB_NOWINDOW);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(e, size, t));
	return 1;
}

// record_used_py is used, the bytes of v's record up to its frames, with
// the Python frames py_put put after them, where it did.
static __always_inline __u32 record_used_py(struct nowindow_val *v, __u32 used)
{
	if (v->r.h.flags & CT_F_PYHEAD) { // its count, the frames, the count again
		__u32 pn = *(volatile __u32 *)((__u8 *)&v->r + used);
		if (pn > CT_PY_MAX_FRAMES) // never: py_put caps it
			pn = CT_PY_MAX_FRAMES;
		used += 2 * sizeof(struct ct_pytrailer) + pn * sizeof(struct ct_pyframe);
	}
	return used;
}

// ct_keep_nowindow makes and submits the record the CPU's nowindow entry
// describes, filled since the count seq (nowindow_fill): frames from the
// frame pointers, no CT_F_WINDOW (user space takes them as they are, as
// with --stack-window 0), its Python frames; counted ringbuf_no_window.
// It says whether it did: 0 where even this record finds no room, or the
// entry was written over by another record's fill (a thread that
// preempted the caller).
__noinline int ct_keep_nowindow(__u64 seq)
{
	__u32 zero = 0;
	struct nowindow_val *v = bpf_map_lookup_elem(&nowindow, &zero);
	if (!v)
		return 0;
	v->r.h.nframes = fp_stack(v->ip, v->fp, v->r.stack, CT_MAX_FRAMES);
	// The count read back from the record: a number the verifier does
	// not know. Kept in a register, it is one constant for each frame the
	// walk can stop at, and the verifier checked what follows (the Python
	// frames' copy, three sizes of record) once for each: two thirds of
	// all it checked of ct_exit (docs/benchmarks.md).
	__u32 n = *(volatile __u32 *)&v->r.h.nframes;
	if (n == CT_MAX_FRAMES)
		v->r.h.flags |= CT_F_STACK_TRUNC;
	__u32 used = sizeof(struct ct_event) + (n & 127) * 8;
	// The Python walk's outcome read here, not before the walk above:
	// held across it, it took two more slots of this frame, which the
	// return programs' frames leave 96 bytes for (TestStackChains).
	struct py_walked pw = {.seq = v->py_seq, .mm = v->py_mm};
	py_put(&v->r.h, (__u8 *)&v->r + used, pw);
	used = record_used_py(v, used);
	// A few sizes: a short stack, a deeper one, the most.
	_Static_assert(sizeof(struct ct_alloc_event) + CT_PY_BLOCK < 2048, "a record without its window fits 2 KiB");
	int r = record_out(v, used, seq, 256, NULL, 1);
	if (r < 0)
		r = record_out(v, used, seq, 1024, NULL, 1);
	if (r < 0)
		r = record_out(v, used, seq, 2048, NULL, 1);
	return r > 0;
}

// keep_nowindow hands the filled entry v (nowindow_fill: seq) to
// ct_keep_nowindow, with the registers of ctx and the Python walk pw,
// and counts the record lost where it could not be kept.
static __always_inline void keep_nowindow(struct pt_regs *ctx, struct nowindow_val *v, __u64 seq, struct py_walked pw)
{
	v->ip = PT_REGS_IP(ctx);
	v->fp = PT_REGS_FP(ctx);
	v->py_seq = pw.seq;
	v->py_mm = pw.mm;
	if (!ct_keep_nowindow(seq))
		count(CT_CNT_RB_FULL);
}

// submit_unwound finishes the allocation record built in the CPU's
// nowindow entry v (nowindow_fill: seq), its header filled: its stack
// unwound here, its Python frames; and copies it to the ring buffer at the
// size it uses (record_out: 256 bytes for a stack of 23 frames, 512 for
// 55), not at the most frames and Python frames one could hold (~1.6 KiB):
// a ring holds three to six times more records, and the reader reads less
// memory for each. Where the unwind falls back, the record is made at
// alloc_record_size() with the frame-pointer walk and the window
// (submit_alloc); where the reader is behind by more than half the ring,
// or the ring has no room for the window, it is kept without the window
// (ct_keep_nowindow), as in a burst of records with windows: a process's
// first records, before the rules for its files are made, fall back, and
// a process that starts with a burst would otherwise lose them. Built in
// v, a fallback costs no reservation given back (overhead.sh's short runs
// fall back for a quarter of their records).
static __always_inline void submit_unwound(struct pt_regs *ctx, struct nowindow_val *v, __u64 seq,
					   struct py_walked pw, struct ct_thread *t)
{
	struct ct_alloc_event *r = &v->r;
	if (uw_stack(ctx, r, r->h.flags & CT_F_ENTRY_ONLY)) {
		r->h.flags |= CT_F_UNWOUND;
		__u32 n = *(volatile __u32 *)&r->h.nframes;
		if (n == CT_MAX_FRAMES)
			r->h.flags |= CT_F_STACK_TRUNC;
		__u32 used = sizeof(struct ct_event) + (n & 127) * 8;
		py_put(&r->h, (__u8 *)r + used, pw);
		used = record_used_py(v, used);
		int k = record_out(v, used, seq, 256, t, 0);
		if (k < 0)
			k = record_out(v, used, seq, 512, t, 0);
		if (k < 0)
			k = record_out(v, used, seq, 1024, t, 0);
		if (k < 0)
			k = record_out(v, used, seq, 2048, t, 0);
		if (k <= 0)
			count(CT_CNT_RB_FULL);
		return;
	}
	struct ct_alloc_event *b = NULL;
	if (!ring_behind())
		b = bpf_ringbuf_reserve(&events, alloc_record_size(), 0);
	if (!b) {
		keep_nowindow(ctx, v, seq, pw);
		return;
	}
	b->h = r->h;
	barrier();
	if (*(volatile __u64 *)&v->seq != seq) { // a preempting fill wrote over the header
		bpf_ringbuf_discard(b, BPF_RB_NO_WAKEUP);
		count(CT_CNT_RB_FULL);
		return;
	}
	submit_alloc(ctx, b, pw, t);
}

// reserve_alloc reserves an allocation record that is not unwound here
// (submit_unwound): a VMM mapping's where records are (uw_small: it copies
// no window), else one with room for the window.
static __always_inline struct ct_alloc_event *reserve_alloc(void)
{
	if (uw_small())
		return bpf_ringbuf_reserve(&events, small_record_size(), 0);
	return bpf_ringbuf_reserve(&events, alloc_record_size(), 0);
}

// walk_python walks the calling thread's Python frames and captures the
// code objects new to its process (py_walk, py_check): before its record
// is reserved, so that the captures come first in the ring buffer.
static __always_inline struct py_walked walk_python(struct pt_regs *ctx, __u64 id, const int use_loop)
{
	struct py_walked pw = py_walk(id, PT_REGS_SP(ctx), use_loop);
	py_check(pw, id, use_loop);
	return pw;
}

// alloc_result says what a call whose entry is in and whose result is
// result allocated (*addr: read from the call's out-arguments where it
// succeeded) and how much (*size: asked for, or made, where the call
// rounds it). Read once, before the record is reserved, so that the
// record and the one kept without its window (keep_nowindow) are filled
// alike from it: two inlined copies of these reads made ct_exit 200
// instructions longer.
static __always_inline void alloc_result(struct inflight *in, __s32 result, __u64 *addr, __u64 *size)
{
	*addr = 0;
	*size = in->size;
	if (result == 0) {
		__u64 pitch = 0;
		switch (in->shape) {
		case CT_SHAPE_ALLOC:
		case CT_SHAPE_VMM_CREATE: // the handle stands for the address
			bpf_probe_read_user(addr, sizeof(*addr), (void *)in->out);
			break;
		case CT_SHAPE_PITCH:
			bpf_probe_read_user(addr, sizeof(*addr), (void *)in->out);
			bpf_probe_read_user(&pitch, sizeof(pitch), (void *)in->aux1);
			*size = pitch * in->aux2;
			break;
		case CT_SHAPE_3D: {
			__u64 pp[2] = {}; // cudaPitchedPtr.ptr, .pitch
			bpf_probe_read_user(pp, sizeof(pp), (void *)in->out);
			*addr = pp[0];
			*size = pp[1] * in->aux1 * in->aux2;
			break;
		}
		}
	} else if (in->shape == CT_SHAPE_3D) {
		*size = in->size * in->aux1 * in->aux2; // what was asked for
	} else if (in->shape == CT_SHAPE_PITCH) {
		*size = in->size * in->aux2;
	}
}

// forget_free clears the thread's latest free (t: its entry), in place,
// the entry kept for its next free: after an allocation its address may
// come back.
static __always_inline void forget_free(struct ct_thread *t)
{
	t->free.addr = 0;
}

static __always_inline int alloc_exit(struct pt_regs *ctx, const int use_loop)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct ct_thread *t = bpf_map_lookup_elem(&threads, &tid);
	struct inflight *in = t ? &t->call : NULL;
	if (!t || !in->sp) {
		// Only a traced process's: another process calling the same
		// library file runs this probe too.
		if (traced(id >> 32))
			count(CT_CNT_NO_ENTRY);
		return 0;
	}
	// After `ret` the stack pointer is CT_RET_SP_DELTA above what it was at
	// entry (8 on x86-64, 0 on arm64); any other value is the return of a
	// nested call, which the outer call's return will account for.
	if (PT_REGS_SP(ctx) != in->sp + CT_RET_SP_DELTA)
		return 0;

	__s32 result = (__s32)PT_REGS_RC(ctx);
	if (in->shape == CT_SHAPE_SETDEV) {
		if (result == 0) {
			t->dev = (__s32)in->aux1;
		}
		call_done(in);
		return 0;
	}

	struct py_walked pw = {};
	if (in->shape != CT_SHAPE_VMM_MAP)
		pw = walk_python(ctx, id, use_loop);
	__u64 addr, size;
	alloc_result(in, result, &addr, &size);
	// The thread's device now: unknown at entry, it may have been learned
	// inside the call (the runtime asks the driver for its context:
	// ct_learn_exit).
	__s32 dev = in->device == CT_DEV_UNKNOWN ? thread_device(t) : in->device;
	__u64 ts = in->ts_ns, dur = bpf_ktime_get_boot_ns() - ts;
	// A VMM mapping's record has no window to leave out. One unwound here
	// (uw_small) is built in the CPU's nowindow entry and copied out at
	// the size it uses (submit_unwound). One that copies a window is
	// reserved at ~18 KiB, where one kept without the window takes 256
	// bytes for a short stack: while the reader is behind, records are
	// kept so, their frames the frame pointers' (a burst keeps 6 times
	// more).
	int keepable = in->shape != CT_SHAPE_VMM_MAP && nowindow_ok();
	if (keepable && uw_small()) {
		__u64 seq = 0;
		struct nowindow_val *v = nowindow_fill(&seq);
		if (!v) { // never: a per-CPU array's one entry
			count(CT_CNT_RB_FULL);
			call_done(in);
			return 0;
		}
		fill_event(&v->r.h, id, ts, dur, in->api, 0, addr, size, dev, result);
		call_done(in);
		submit_unwound(ctx, v, seq, pw, t);
		forget_free(t);
		return 0;
	}
	struct ct_alloc_event *e = NULL;
	if (!keepable || !ring_behind())
		e = reserve_alloc();
	if (!e) {
		__u64 seq = 0;
		struct nowindow_val *v = keepable ? nowindow_fill(&seq) : NULL;
		if (!v) {
			count(CT_CNT_RB_FULL);
			call_done(in);
			return 0;
		}
		fill_event(&v->r.h, id, ts, dur, in->api, 0, addr, size, dev, result);
		call_done(in);
		keep_nowindow(ctx, v, seq, pw);
		forget_free(t);
		return 0;
	}
	fill_event(&e->h, id, ts, dur, in->api, 0, addr, size, dev, result);

	if (in->shape == CT_SHAPE_VMM_MAP) { // failed or not, the call's arguments say it all
		e->h.addr = in->aux1;
		e->h.flags = CT_F_AUX;
		e->stack[0] = in->aux2;
		call_done(in);
		e->h.nframes = user_stack(ctx, &e->stack[1], CT_MAX_FRAMES - 1);
		if (e->h.nframes == CT_MAX_FRAMES - 1)
			e->h.flags |= CT_F_STACK_TRUNC;
		count(CT_CNT_EVENTS);
		// no stack window: its frames sit one slot on
		bpf_ringbuf_submit(e, wakeup_flags(&e->h, uw_small() ? small_record_size() : alloc_record_size(), t));
		return 0;
	}
	call_done(in);

	if (uw_small()) {
		// Never: a record that is not a VMM mapping's went to
		// submit_unwound above. The verifier, which does not know that
		// the shape read twice is the same, checks this path too.
		bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
		count(CT_CNT_RB_FULL);
		forget_free(t);
		return 0;
	}
	// At the return probe the caller's frames are complete; at entry the
	// direct caller would be missing (the callee has not pushed rbp yet).
	submit_alloc(ctx, e, pw, t);
	forget_free(t);
	return 0;
}

// The return probe of every call that makes a record, in two variants that
// differ only in how the Python walk loops (see py_stack).
SEC("uretprobe")
int ct_exit(struct pt_regs *ctx)
{
	return alloc_exit(ctx, 1);
}

SEC("uretprobe")
int ct_exit_noloop(struct pt_regs *ctx)
{
	return alloc_exit(ctx, 0);
}


// Frees: (void *ptr, ...). The record goes out before the library releases
// the memory (see the top of this file). size is the range's length for
// calls that take one (cuMemUnmap, cuMemAddressFree), 0 otherwise.
static __always_inline int free_enter(struct pt_regs *ctx, __u64 size)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	struct ct_thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (!thread_traced(t, tgid))
		return 0;
	__u64 addr = PT_REGS_PARM1(ctx);
	if (addr == 0)
		return 0; // cudaFree(NULL) is a no-op (and a common way to init a context)

	__u64 sp = PT_REGS_SP(ctx), now = bpf_ktime_get_boot_ns();
	if (!t)
		t = thread_get(tid, NULL); // its first traced call
	if (t) {
		struct last_free *lf = &t->free;
		if (lf->addr == addr && sp < lf->sp && now - lf->ts_ns < CT_NESTED_FREE_NS) {
			count(CT_CNT_NESTED); // the runtime's free, reaching the driver: counted once
			return 0;
		}
		// written in place: only this thread writes its entry
		lf->addr = addr;
		lf->sp = sp;
		lf->ts_ns = now;
	}

	submit_entry(id, now, (__u16)bpf_get_attach_cookie(ctx), addr, size, thread_device(t), t);
	return 0;
}

SEC("uprobe")
int ct_free_enter(struct pt_regs *ctx)
{
	return free_enter(ctx, 0);
}

SEC("uprobe")
int ct_sized_free_enter(struct pt_regs *ctx)
{
	return free_enter(ctx, PT_REGS_PARM2(ctx));
}

#endif
