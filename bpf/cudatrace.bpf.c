//go:build ignore
// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// Uprobes on CUDA's allocation entry points. One program per argument
// layout, told which function it serves by the attach cookie (the API id).
// Entry programs remember the arguments per thread; the return program reads
// the result and submits one record. Frees are recorded at entry: the record
// then reaches the ring buffer before the memory can be handed out again, so
// a reused address is never seen allocated before it is seen freed, and it
// saves the third trap per call.

#include <linux/bpf.h>
#include <linux/types.h>
#include <asm/ptrace.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "cudatrace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

// Emit the record types into BTF so bpf2go generates their Go twins.
const struct ct_alloc_event *unused_ct_alloc_event __attribute__((unused));
const struct ct_usdt_spec *unused_ct_usdt_spec __attribute__((unused));
const struct ct_ustack *unused_ct_ustack __attribute__((unused));
const struct ct_pyoffsets *unused_ct_pyoffsets __attribute__((unused));
const struct ct_pyframe *unused_ct_pyframe __attribute__((unused));
const struct ct_pytrailer *unused_ct_pytrailer __attribute__((unused));

// Set from Go before load (spec.Variables).
const volatile __u8 filter_pids = 0;         // 1: only processes in `pids`
const volatile __u8 follow_forks = 1;        // children of traced processes are traced
const volatile __u64 wakeup_bytes = 1 << 20; // wake the reader only past this much unread data
// Bytes of user stack copied into each allocation record for unwinding in
// user space: 0, or a multiple of CT_PAGE up to CT_MAX_WINDOW. The verifier
// sees it as a constant, so records are reserved at the size it makes.
const volatile __u32 stack_window = 0;
// 1: stop each process at its first record until the reader has read its
// mappings (see wakeup_flags). Set for launched commands.
const volatile __u8 hold_new = 0;

#define CT_SIGSTOP 19

// Room for the Python frames at the end of every allocation record.
#define CT_PY_BLOCK (CT_PY_MAX_FRAMES * sizeof(struct ct_pyframe) + sizeof(struct ct_pytrailer))


struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); // overridden from Go
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);  // tgid
	__type(value, __u8);
} pids SEC(".maps");

struct inflight {
	__u64 ts_ns;
	__u64 sp; // stack pointer at entry: tells the matching return from a nested one
	__u64 out;
	__u64 size;
	__u64 aux1; // PITCH: size_t *pitch; 3D: extent.height; VMM_MAP: va
	__u64 aux2; // PITCH: height;        3D: extent.depth;  VMM_MAP: handle
	__u16 api;
	__u16 shape;
	__s32 device;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32); // tid
	__type(value, struct inflight);
} inflight SEC(".maps");

// The CUDA runtime's current device is per thread: cudaSetDevice sets it.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); // tid
	__type(value, __s32);
} thread_dev SEC(".maps");

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

// Each thread's latest free, to know the driver's free that a runtime free
// makes inside itself (cudaFree -> cuMemFree_v2: the same pointer, deeper in
// the stack, within a millisecond) from a free of its own. An allocation
// record of the thread clears it: the address may come back and be freed
// again (a loop of cudaMalloc and cudaFree frees one address from one
// place over and over).
struct last_free {
	__u64 addr;
	__u64 sp;
	__u64 ts_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); // tid
	__type(value, struct last_free);
} last_free SEC(".maps");

#define CT_NESTED_FREE_NS 1000000

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CT_USDT_MAX_SPECS);
	__type(key, __u32); // the attach cookie
	__type(value, struct ct_usdt_spec);
} usdt_specs SEC(".maps");

// Processes that already had a record: their first one wakes the reader at
// once so it can read /proc/PID/maps before a short-lived process is gone.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} seen SEC(".maps");

// Processes hold_new stopped and the reader has not resumed yet, each with
// the CLOCK_BOOTTIME ns it was stopped at. The reader deletes a process's
// entry as it sends SIGCONT; a watchdog process holding this map's fd
// resumes whatever is left when the tracer dies (internal/watchdog). Full:
// no more processes are stopped.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);   // tgid
	__type(value, __u64); // boot ns when stopped
} held SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CT_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// CPython processes: their interpreter's layout (see py_stack).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); // tgid
	__type(value, struct ct_pyoffsets);
} py_procs SEC(".maps");

// Only the fields used here; CO-RE finds them in the running kernel's BTF.
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1; // per-CPU: no atomics needed
}

static __always_inline int traced(__u32 tgid)
{
	if (!filter_pids)
		return 1;
	return bpf_map_lookup_elem(&pids, &tgid) != NULL;
}

static __always_inline __s32 current_device(__u32 tid)
{
	__s32 *d = bpf_map_lookup_elem(&thread_dev, &tid);
	return d ? *d : 0;
}

// hold stops the current process (SIGSTOP, on its way back to user space)
// for the reader, and says whether it did. Never when the reader is behind
// (as much unread as wakes it: it is not keeping up, and would keep the
// process waiting), nor without an entry in `held`, which is what resumes
// it if the tracer dies before its reader gets there.
static __always_inline int hold(__u32 tgid)
{
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return 0;
	__u64 now = bpf_ktime_get_boot_ns();
	if (bpf_map_update_elem(&held, &tgid, &now, BPF_NOEXIST))
		return 0;
	if (bpf_send_signal(CT_SIGSTOP)) {
		bpf_map_delete_elem(&held, &tgid);
		return 0;
	}
	return 1;
}

// wakeup_flags says how to submit e. A process's first record wakes the
// reader at once so it can read /proc/PID/maps before a short-lived
// process is gone; with hold_new it also stops the process (hold) and flags
// the record, and the reader sends SIGCONT once it has read the mappings: a
// process that exits right after its first allocation still symbolizes.
static __always_inline __u64 wakeup_flags(struct ct_event *e)
{
	__u8 one = 1;
	__u32 tgid = e->pid;
	if (bpf_map_lookup_elem(&seen, &tgid) == NULL) {
		bpf_map_update_elem(&seen, &tgid, &one, BPF_ANY);
		if (hold_new && hold(tgid))
			e->flags |= CT_F_HELD;
		return BPF_RB_FORCE_WAKEUP;
	}
	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

// remember stores the call's arguments for the return probe. A call made
// while another traced call of the same thread is under way (cudaMallocHost
// calling cudaHostAlloc inside the library) is nested: the outer one is the
// call the application made, so the inner one is left out.
static __always_inline int remember(struct pt_regs *ctx, __u16 shape, __u64 out, __u64 size,
				    __u64 aux1, __u64 aux2)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	if (!traced(tgid))
		return 0;

	__u64 sp = PT_REGS_SP(ctx);
	struct inflight *cur = bpf_map_lookup_elem(&inflight, &tid);
	if (cur) {
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
		// cuMemCreate says its device; every other call uses the thread's.
		.device = shape == CT_SHAPE_VMM_CREATE ? (__s32)aux1 : current_device(tid),
	};
	if (bpf_map_update_elem(&inflight, &tid, &in, BPF_ANY))
		count(CT_CNT_INFLIGHT_FULL);
	return 0;
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
// 24-byte extent is passed in memory, just above the return address.
SEC("uprobe")
int ct_3d_enter(struct pt_regs *ctx)
{
	__u64 ext[3] = {}; // width, height, depth
	bpf_probe_read_user(ext, sizeof(ext), (void *)(PT_REGS_SP(ctx) + 8));
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

// user_stack walks the frame-pointer chain from the registers at a return
// probe: the interrupted instruction first, then each frame's return
// address. bpf_get_stack(BPF_F_USER_STACK) makes the same walk in the
// kernel, but cost about 5 µs a call on the 6.18 VMs here, as much as a
// uprobe trap; these reads cost too little to measure (docs/benchmarks.md).
// The chain must climb the stack: a frame pointing down or to itself is
// code without frame pointers reusing rbp, and the walk stops there.
static __always_inline __s32 user_stack(struct pt_regs *ctx, __u64 *stack, const __s32 max)
{
	__u64 fp = PT_REGS_FP(ctx);
	__s32 n = 1;

	stack[0] = PT_REGS_IP(ctx);
	for (; n < max; n++) {
		__u64 frame[2]; // the caller's rbp, the return address
		if (fp == 0)
			break;
		if (bpf_probe_read_user(frame, sizeof(frame), (void *)fp)) {
			count(CT_CNT_STACK_ERR);
			break;
		}
		stack[n] = frame[1];
		if (frame[0] <= fp) {
			n++;
			break;
		}
		fp = frame[0];
	}
	return n;
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
// frame slot, and the registers and window when a window is copied.
static __always_inline __u32 alloc_record_size(void)
{
	__u32 w = window_size();
	return sizeof(struct ct_alloc_event) + (w ? sizeof(struct ct_ustack) + w : 0) + CT_PY_BLOCK;
}

// user_window puts the registers and up to window_size() bytes of user stack
// from sp up right after the record's nframes frames, and flags the record.
// One read takes the whole window; where it fails, the stack ends inside
// the window (the top of the main thread's stack, a thread's guard page) and
// a page-by-page read keeps what lies below the first unreadable page.
static __always_inline void user_window(struct pt_regs *ctx, struct ct_alloc_event *e)
{
	__u32 w = window_size();
	if (!w)
		return;
	__u32 n = (__u32)e->h.nframes & 127; // user_stack gives 1..CT_MAX_FRAMES
	struct ct_ustack *u = (void *)e->stack + n * 8;
	__u8 *data = (void *)(u + 1);
	__u64 sp = PT_REGS_SP(ctx);
	__u32 len = 0;

	u->ip = PT_REGS_IP(ctx);
	u->sp = sp;
	u->bp = PT_REGS_FP(ctx);
	if (bpf_probe_read_user(data, w, (void *)sp) == 0) {
		len = w;
	} else {
		__u32 first = CT_PAGE - (sp & (CT_PAGE - 1)); // to the end of sp's page
		if (bpf_probe_read_user(data, first, (void *)sp) == 0) {
			len = first;
			for (int i = 0; i < CT_MAX_WINDOW / CT_PAGE; i++) {
				if (len > w - CT_PAGE)
					break; // what is left lies on the page that failed
				if (bpf_probe_read_user(data + len, CT_PAGE, (void *)(sp + len)))
					break;
				len += CT_PAGE;
			}
		}
	}
	u->len = len;
	u->pad = 0;
	e->h.flags |= CT_F_WINDOW;
}

static __always_inline __u64 read_u64(__u64 addr)
{
	__u64 v = 0;
	bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

// The Python frames block is built here, then copied to the record whole.
struct py_block {
	struct ct_pyframe f[CT_PY_MAX_FRAMES];
	struct ct_pytrailer t;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct py_block);
} py_scratch SEC(".maps");

// A walk's state, shared with its bpf_loop callbacks: the verifier checks
// a callback once, not once per iteration and branch.
struct py_walk {
	struct ct_pyoffsets o;
	__u64 want; // the thread id a thread state must hold
	__s64 idoff;
	__u64 ts;    // the thread state under examination, then the thread's
	__u64 frame; // the interpreter frame under examination
	__u32 n;     // frames recorded
	__u32 found;
};

static long py_thread_step(__u64 i, void *arg)
{
	struct py_walk *w = arg;
	if (!w->ts)
		return 1;
	if (read_u64(w->ts + w->idoff) == w->want) {
		w->found = 1;
		return 1;
	}
	w->ts = read_u64(w->ts + w->o.ts_next);
	return 0;
}

static long py_frame_step(__u64 i, void *arg)
{
	struct py_walk *w = arg;
	__u32 zero = 0;
	struct py_block *b = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!b || !w->frame)
		return 1;
	__u64 frame = w->frame;
	__u32 n = w->n;
	w->frame = read_u64(frame + w->o.fr_previous);
	if (w->o.fr_owner >= 0) {
		__u8 owner = 0;
		bpf_probe_read_user(&owner, 1, (void *)(frame + w->o.fr_owner));
		if (owner == 3) { // a shim frame: the run above it ended one C call
			if (n > 0 && n <= CT_PY_MAX_FRAMES)
				b->f[(CT_PY_MAX_FRAMES - n) & (CT_PY_MAX_FRAMES - 1)].flags |= 1;
			return 0;
		}
	}
	if (n >= CT_PY_MAX_FRAMES)
		return 1;
	// masked for the verifier, which cannot follow n through w
	struct ct_pyframe *f = &b->f[(CT_PY_MAX_FRAMES - 1 - n) & (CT_PY_MAX_FRAMES - 1)];
	f->code = read_u64(frame + w->o.fr_code);
	f->flags = 0;
	if (w->o.minor == 10) {
		__s32 lasti = 0;
		bpf_probe_read_user(&lasti, sizeof(lasti), (void *)(frame + w->o.fr_instr));
		f->units = lasti;
		f->flags = 1;
	} else {
		__u64 ip = read_u64(frame + w->o.fr_instr);
		// arithmetic shift: BPF has no signed division
		f->units = (__s32)((__s64)(ip - f->code - w->o.co_code_adaptive) >> 1);
		if (w->o.fr_entry >= 0) {
			__u8 entry = 0;
			bpf_probe_read_user(&entry, 1, (void *)(frame + w->o.fr_entry));
			f->flags = entry ? 1 : 0;
		}
	}
	w->n = n + 1;
	return 0;
}

// py_stack puts the calling thread's Python frames (code object and
// instruction) at the end of the record, block being the CT_PY_BLOCK bytes
// reserved there, and flags the record; a CPython process's thread without
// Python frames is flagged CT_F_NOPYTHON. The thread state is found by
// native_thread_id from 3.11, by pthread_self (the thread pointer, fsbase
// on x86-64) in 3.10. Code objects are resolved to file:line in user space
// (record/python.go): the walk only follows pointers, a few reads a frame.
static __always_inline void py_stack(struct ct_event *h, __u8 *block)
{
	__u32 tgid = h->pid, zero = 0;
	struct ct_pyoffsets *o = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!o)
		return;
	struct py_block *b = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!b)
		return;
	struct py_walk w = {.o = *o, .want = h->tid, .idoff = o->ts_native_id};
	if (o->minor == 10) {
		struct task_struct *t = (void *)bpf_get_current_task();
		w.want = BPF_CORE_READ(t, thread.fsbase);
		w.idoff = o->ts_thread_id;
	}
	__u64 interp = read_u64(o->interp_head);
	if (interp)
		w.ts = read_u64(interp + o->interp_threads);
	bpf_loop(CT_PY_MAX_THREADS, py_thread_step, &w, 0);
	if (w.found) {
		if (w.o.ts_cframe >= 0) {
			__u64 cf = read_u64(w.ts + w.o.ts_cframe);
			if (cf)
				w.frame = read_u64(cf + w.o.cf_current);
		} else {
			w.frame = read_u64(w.ts + w.o.ts_frame);
		}
		bpf_loop(CT_PY_MAX_FRAMES + 8, py_frame_step, &w, 0); // shim frames take turns too
	}
	b->t.n = w.n;
	b->t.pad = 0;
	__builtin_memcpy(block, b, sizeof(*b));
	h->flags |= w.n ? CT_F_PYTHON : CT_F_NOPYTHON;
}

static __always_inline void fill_common(struct ct_event *e, __u64 id)
{
	e->pid = id >> 32;
	e->tid = (__u32)id;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
}

SEC("uretprobe")
int ct_exit(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct inflight *in = bpf_map_lookup_elem(&inflight, &tid);
	if (!in) {
		count(CT_CNT_NO_ENTRY);
		return 0;
	}
	// After `ret` the stack pointer is 8 above what it was at entry; any
	// other value is the return of a nested call, which the outer call's
	// return will account for.
	if (PT_REGS_SP(ctx) != in->sp + 8)
		return 0;

	__s32 result = (__s32)PT_REGS_RC(ctx);
	if (in->shape == CT_SHAPE_SETDEV) {
		if (result == 0) {
			__s32 dev = (__s32)in->aux1;
			bpf_map_update_elem(&thread_dev, &tid, &dev, BPF_ANY);
		}
		bpf_map_delete_elem(&inflight, &tid);
		return 0;
	}

	struct ct_alloc_event *e = bpf_ringbuf_reserve(&events, alloc_record_size(), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		bpf_map_delete_elem(&inflight, &tid);
		return 0;
	}
	__u64 now = bpf_ktime_get_boot_ns();
	e->h.ts_ns = in->ts_ns;
	e->h.dur_ns = now - in->ts_ns;
	e->h.api = in->api;
	e->h.device = in->device;
	e->h.result = result;
	e->h.flags = 0;
	e->h.addr = 0;
	e->h.size = in->size;
	fill_common(&e->h, id);

	if (in->shape == CT_SHAPE_VMM_MAP) { // failed or not, the call's arguments say it all
		e->h.addr = in->aux1;
		e->h.flags = CT_F_AUX;
		e->stack[0] = in->aux2;
		bpf_map_delete_elem(&inflight, &tid);
		e->h.nframes = user_stack(ctx, &e->stack[1], CT_MAX_FRAMES - 1);
		if (e->h.nframes == CT_MAX_FRAMES - 1)
			e->h.flags |= CT_F_STACK_TRUNC;
		count(CT_CNT_EVENTS);
		bpf_ringbuf_submit(e, wakeup_flags(&e->h)); // no stack window: its frames sit one slot on
		return 0;
	}

	if (result == 0) {
		__u64 addr = 0, pitch = 0;
		switch (in->shape) {
		case CT_SHAPE_ALLOC:
		case CT_SHAPE_VMM_CREATE: // the handle stands for the address
			bpf_probe_read_user(&addr, sizeof(addr), (void *)in->out);
			break;
		case CT_SHAPE_PITCH:
			bpf_probe_read_user(&addr, sizeof(addr), (void *)in->out);
			bpf_probe_read_user(&pitch, sizeof(pitch), (void *)in->aux1);
			e->h.size = pitch * in->aux2;
			break;
		case CT_SHAPE_3D: {
			__u64 pp[2] = {}; // cudaPitchedPtr.ptr, .pitch
			bpf_probe_read_user(pp, sizeof(pp), (void *)in->out);
			addr = pp[0];
			e->h.size = pp[1] * in->aux1 * in->aux2;
			break;
		}
		}
		e->h.addr = addr;
	} else if (in->shape == CT_SHAPE_3D) {
		e->h.size = in->size * in->aux1 * in->aux2; // what was asked for
	} else if (in->shape == CT_SHAPE_PITCH) {
		e->h.size = in->size * in->aux2;
	}
	bpf_map_delete_elem(&inflight, &tid);

	// At the return probe the caller's frames are complete; at entry the
	// direct caller would be missing (the callee has not pushed rbp yet).
	e->h.nframes = user_stack(ctx, e->stack, CT_MAX_FRAMES);
	if (e->h.nframes == CT_MAX_FRAMES)
		e->h.flags |= CT_F_STACK_TRUNC;
	user_window(ctx, e);
	py_stack(&e->h, (__u8 *)e + alloc_record_size() - CT_PY_BLOCK);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(&e->h));
	bpf_map_delete_elem(&last_free, &tid);
	return 0;
}

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
SEC("uprobe")
int ct_usdt(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if (!traced(id >> 32))
		return 0;
	__u32 key = (__u32)bpf_get_attach_cookie(ctx);
	struct ct_usdt_spec *spec = bpf_map_lookup_elem(&usdt_specs, &key);
	if (!spec)
		return 0;
	__u64 ptr = usdt_arg(ctx, &spec->args[0]);
	if (spec->is_free) {
		struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
		if (!e) {
			count(CT_CNT_RB_FULL);
			return 0;
		}
		e->ts_ns = bpf_ktime_get_boot_ns();
		e->dur_ns = 0;
		e->addr = ptr;
		e->size = 0;
		e->device = current_device((__u32)id);
		e->result = 0;
		e->api = spec->api;
		e->flags = CT_F_ENTRY_ONLY;
		e->nframes = 0;
		fill_common(e, id);
		count(CT_CNT_EVENTS);
		bpf_ringbuf_submit(e, wakeup_flags(e));
		return 0;
	}
	struct ct_alloc_event *e = bpf_ringbuf_reserve(&events, alloc_record_size(), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		return 0;
	}
	e->h.ts_ns = bpf_ktime_get_boot_ns();
	e->h.dur_ns = 0;
	e->h.addr = ptr;
	e->h.device = (__s32)usdt_arg(ctx, &spec->args[1]);
	e->h.size = usdt_arg(ctx, &spec->args[2]);
	e->h.result = 0;
	e->h.api = spec->api;
	e->h.flags = CT_F_ENTRY_ONLY;
	fill_common(&e->h, id);
	// The probe sits in the allocator's function body, past its prologue:
	// the frame-pointer chain starts at its caller's frame.
	e->h.nframes = user_stack(ctx, e->stack, CT_MAX_FRAMES);
	if (e->h.nframes == CT_MAX_FRAMES)
		e->h.flags |= CT_F_STACK_TRUNC;
	user_window(ctx, e);
	py_stack(&e->h, (__u8 *)e + alloc_record_size() - CT_PY_BLOCK);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(&e->h));
	return 0;
}

// Frees: (void *ptr, ...). The record goes out before the library releases
// the memory (see the top of this file). size is the range's length for
// calls that take one (cuMemUnmap, cuMemAddressFree), 0 otherwise.
static __always_inline int free_enter(struct pt_regs *ctx, __u64 size)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!traced(tgid))
		return 0;
	__u64 addr = PT_REGS_PARM1(ctx);
	if (addr == 0)
		return 0; // cudaFree(NULL) is a no-op (and a common way to init a context)

	__u32 tid = (__u32)id;
	__u64 sp = PT_REGS_SP(ctx), now = bpf_ktime_get_boot_ns();
	struct last_free *lf = bpf_map_lookup_elem(&last_free, &tid);
	if (lf && lf->addr == addr && sp < lf->sp && now - lf->ts_ns < CT_NESTED_FREE_NS) {
		count(CT_CNT_NESTED); // the runtime's free, reaching the driver: counted once
		return 0;
	}
	struct last_free nf = {.addr = addr, .sp = sp, .ts_ns = now};
	bpf_map_update_elem(&last_free, &tid, &nf, BPF_ANY);

	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		return 0;
	}
	e->ts_ns = now;
	e->dur_ns = 0;
	e->addr = addr;
	e->size = size;
	e->device = current_device(tid);
	e->result = 0;
	e->api = (__u16)bpf_get_attach_cookie(ctx);
	e->flags = CT_F_ENTRY_ONLY;
	e->nframes = 0;
	fill_common(e, id);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(e));
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

// A traced process's children are traced too (a launched shell script, a
// PyTorch DataLoader worker, torchrun's ranks).
SEC("tp_btf/sched_process_fork")
int BPF_PROG(ct_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!filter_pids || !follow_forks)
		return 0;
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	if (!bpf_map_lookup_elem(&pids, &ptgid))
		return 0;
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	__u8 one = 1;
	bpf_map_update_elem(&pids, &ctgid, &one, BPF_ANY);
	return 0;
}
