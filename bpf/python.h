// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// CPython processes: the allocating thread's Python frames.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_PYTHON_H
#define CT_PYTHON_H

// CPython processes: their interpreter's layout (see py_stack).
CT_MAP(BPF_MAP_TYPE_HASH, py_procs, __u32, struct ct_pyoffsets, 4096); // key: tgid

// A Python frame of a process: (code object, instruction).
struct py_code_key {
	__u32 tgid;
	__s32 units;
	__u64 code;
};

// The Python frames each process's records have carried. A record with a
// frame not in it holds its process (hold_new, see py_hold_new_frames)
// until the reader has read the frame's code object: one read tens of ms
// later may find it freed (the process exited, or tore its modules down).
CT_MAP(BPF_MAP_TYPE_LRU_HASH, py_codes, struct py_code_key, __u8, 65536);

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

// The walk reads the CT_PY_WINDOW bytes that end with the innermost
// frame's first CT_PY_FRAME_READ bytes in one bpf_probe_read_user: from
// 3.11 the interpreter pushes its frames one above the other on the
// thread's data stack, so most of a stack's frames lie there and cost no
// read of their own (on the VMs here a read costs more than all the rest
// of a frame's step). Frames elsewhere (3.10's, which are heap objects;
// generators'; the shim frames on the C stack; an older data stack chunk)
// are read one by one. What is taken from the window is what a read of
// the frame alone would give: the thread is in the probe, and no one else
// writes its frames.
#define CT_PY_WINDOW 8192
// A thread state's fields the walk takes (the thread's id, its frame or
// cframe pointer) are read in one read of CT_PY_TS_READ bytes from the
// first of them: they lie within 160 bytes of each other in 3.10-3.14.
#define CT_PY_TS_READ 256

// A CPU's scratch: the block being built; buf, the window
// ([0, CT_PY_WINDOW)) and behind it a frame or thread state read alone
// (masked offsets into it may reach 8 bytes past what is read); and the
// block of the CPU's last record with Python frames, whose frames
// py_hold_new_frames has already looked up.
struct py_scratch_val {
	struct py_block b;
	__u8 buf[2 * CT_PY_WINDOW + 8];
	struct py_block last;
	__u32 last_tgid;
	__u32 pad;
};

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, py_scratch, __u32, struct py_scratch_val, 1);

// Each thread's thread state, found by walking the interpreter's thread
// list once (three reads or more, each record). Taken while the thread
// (the same start time) runs the same program (the same mm: an exec makes
// a new one) and the thread state still holds the thread's id.
struct py_thread {
	__u64 ts;
	__u64 mm;
	__u64 start;
};

// A cache: 4096 entries keep its preallocation (every LRU map is
// preallocated) small at start-up; a thread evicted walks the list again.
CT_MAP(BPF_MAP_TYPE_LRU_HASH, py_threads, __u32, struct py_thread, 4096); // key: tid

// The current task's fields the cache checks: a flavour of common.h's
// task_struct (CO-RE matches it to the kernel's by name).
struct task_struct___py {
	void *mm;
	__u64 start_boottime;
} __attribute__((preserve_access_index));

// buf_u64 and buf_u8 take a field from s->buf, at an offset the mask keeps
// within it.
static __always_inline __u64 buf_u64(struct py_scratch_val *s, __u64 idx)
{
	__u64 v;
	__builtin_memcpy(&v, &s->buf[idx & (2 * CT_PY_WINDOW - 1)], sizeof(v));
	return v;
}

static __always_inline __u8 buf_u8(struct py_scratch_val *s, __u64 idx)
{
	return s->buf[idx & (2 * CT_PY_WINDOW - 1)];
}

// A walk's state, shared with its bpf_loop callbacks: the verifier checks
// a callback once, not once per iteration and branch.
struct py_walk {
	struct ct_pyoffsets o;
	__u64 want; // the thread id a thread state must hold
	__s64 idoff;
	__u64 ts;    // the thread state under examination, then the thread's
	__u64 frame; // the interpreter frame under examination
	__u64 lo;    // what the window holds: [lo, hi) of the process's memory
	__u64 hi;
	__u32 n; // frames recorded, in the bpf_loop walk (see frame_step)
	__u32 found;
};

static __always_inline long thread_step(struct py_walk *w)
{
	if (!w->ts)
		return 1;
	if (read_u64(w->ts + w->idoff) == w->want) {
		w->found = 1;
		return 1;
	}
	w->ts = read_u64(w->ts + w->o.ts_next);
	return 0;
}

static __always_inline long frame_step(struct py_walk *w, const int use_loop)
{
	__u32 zero = 0;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s || !w->frame)
		return 1;
	struct py_block *b = &s->b;
	__u64 frame = w->frame;
	__u64 base = CT_PY_WINDOW; // where the frame's bytes are in s->buf
	__u64 end = frame + CT_PY_FRAME_READ;
	// The page's bytes up to the frame's end: the frame's page is mapped,
	// where the one below it may not be (a read that faults costs as much
	// as twenty that do not).
	__u64 len = (frame & (CT_PAGE - 1)) + CT_PY_FRAME_READ;
	if (use_loop && frame >= w->lo && end <= w->hi) {
		base = frame - w->lo; // in the window
	} else if (use_loop && bpf_probe_read_user(s->buf, len, (void *)(end - len)) == 0) {
		w->lo = end - len;
		w->hi = end;
		base = len - CT_PY_FRAME_READ;
	} else if (bpf_probe_read_user(&s->buf[CT_PY_WINDOW], CT_PY_FRAME_READ, (void *)frame)) {
		// One read for the frame's fields: reading them one by one (four
		// or five reads a frame) was most of the walk's cost. Here the
		// frame ends within CT_PY_FRAME_READ bytes of the end of its
		// mapping: its fields one by one, where the one read puts them.
		__u8 *f = &s->buf[CT_PY_WINDOW];
		bpf_probe_read_user(&f[w->o.fr_previous & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_previous));
		bpf_probe_read_user(&f[w->o.fr_code & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_code));
		bpf_probe_read_user(&f[w->o.fr_instr & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_instr));
		bpf_probe_read_user(&f[w->o.fr_owner & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_owner));
		bpf_probe_read_user(&f[w->o.fr_entry & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_entry));
	}
	// The bounded-loop walk keeps the count in the scratch map: read from a
	// map it is a number the verifier does not know, so the paths of one
	// step join again at the next; kept in w it was a constant on each
	// path and that walk forked per count, past the verifier's million
	// instructions. The bpf_loop walk keeps it in w, as 6.1's verifier
	// bounds the index below only then (from the map it rejected the
	// callback: R8 unbounded memory access).
	__u32 n = use_loop ? w->n : b->t.n;
	w->frame = buf_u64(s, base + (w->o.fr_previous & (CT_PY_FRAME_READ - 1)));
	if (w->o.fr_owner >= 0) {
		if (buf_u8(s, base + (w->o.fr_owner & (CT_PY_FRAME_READ - 1))) == 3) { // a shim frame: the run above it ended one C call
			if (n > 0 && n <= CT_PY_MAX_FRAMES)
				b->f[(CT_PY_MAX_FRAMES - n) & (CT_PY_MAX_FRAMES - 1)].flags |= 1;
			return 0;
		}
	}
	if (n >= CT_PY_MAX_FRAMES)
		return 1;
	// masked for the verifier, which cannot follow n through w
	struct ct_pyframe *f = &b->f[(CT_PY_MAX_FRAMES - 1 - n) & (CT_PY_MAX_FRAMES - 1)];
	// 3.14's f_executable is a _PyStackRef whose low bits tag the
	// reference; earlier versions hold a plain pointer. A code object is
	// at least 8-byte aligned, so the mask is a no-op there, and being
	// branch-free it keeps 6.1's verifier able to bound f in the
	// bounded-loop walk (a `minor >= 14` branch here lost that bound).
	f->code = buf_u64(s, base + (w->o.fr_code & (CT_PY_FRAME_READ - 1))) & ~(__u64)7;
	f->flags = 0;
	if (w->o.minor == 10) {
		f->units = (__s32)buf_u64(s, base + (w->o.fr_instr & (CT_PY_FRAME_READ - 1))); // f_lasti, an int
		f->flags = 1;
	} else {
		__u64 ip = buf_u64(s, base + (w->o.fr_instr & (CT_PY_FRAME_READ - 1)));
		// arithmetic shift: BPF has no signed division
		f->units = (__s32)((__s64)(ip - f->code - w->o.co_code_adaptive) >> 1);
		if (w->o.fr_entry >= 0)
			f->flags = buf_u8(s, base + (w->o.fr_entry & (CT_PY_FRAME_READ - 1))) ? 1 : 0;
	}
	if (use_loop)
		w->n = n + 1;
	else
		b->t.n = n + 1;
	return 0;
}

// The bpf_loop (Linux 5.17) callbacks: the verifier checks each once.
static long py_thread_step(__u64 i, void *arg)
{
	return thread_step(arg);
}

static long py_frame_step(__u64 i, void *arg)
{
	return frame_step(arg, 1);
}

// py_hold_new_frames holds the process (hold, as for its first record)
// when one of the frames in b is one its records never carried before, so
// that the reader reads that frame's code object while it surely lives;
// the record is flagged CT_F_HELD and the reader resumes the process once
// it has. Only with hold_new (whose watchdog resumes what the tracer
// leaves held), and whom hold_new says. A frame seen while the process could not
// be held (the reader is behind) is read late, and checked (pystack).
// same_block: a and b hold the same frames (BPF has no memcmp).
static __always_inline int same_block(struct py_block *a, struct py_block *b)
{
	if (a->t.n != b->t.n)
		return 0;
	__u64 *x = (__u64 *)a->f, *y = (__u64 *)b->f;
	for (int i = 0; i < CT_PY_MAX_FRAMES * 2; i++)
		if (x[i] != y[i])
			return 0;
	return 1;
}

static __always_inline void py_hold_new_frames(struct ct_event *h, struct py_scratch_val *s)
{
	if (hold_new == CT_HOLD_NONE || (h->flags & CT_F_HELD))
		return;
	struct py_block *b = &s->b;
	// The same frames as this CPU's last record of the process (a loop
	// allocating from one line): looked up then, each one a map lookup.
	if (s->last_tgid == h->pid && same_block(&s->last, b))
		return;
	__builtin_memcpy(&s->last, b, sizeof(*b));
	s->last_tgid = h->pid;
	__u32 n = *(volatile __u32 *)&b->t.n; // not w.n (see py_stack's copy)
	struct py_code_key k = {.tgid = h->pid};
	__u8 one = 1;
	int fresh = 0;
	for (int i = 0; i < CT_PY_MAX_FRAMES; i++) {
		if (i < CT_PY_MAX_FRAMES - (int)n)
			continue;
		k.code = b->f[i].code;
		k.units = b->f[i].units;
		if (!bpf_map_lookup_elem(&py_codes, &k)) {
			bpf_map_update_elem(&py_codes, &k, &one, BPF_ANY);
			fresh = 1;
		}
	}
	if (fresh && hold(h->pid))
		h->flags |= CT_F_HELD;
}

// ts_take says whether ts is the thread's thread state (it holds the
// thread's id: w->want at w->idoff) and, if it is, points w at it and at
// its innermost frame. One read takes both fields where they lie within
// CT_PY_TS_READ bytes of each other.
static __always_inline int ts_take(struct py_walk *w, struct py_scratch_val *s, __u64 ts)
{
	__s64 fo = w->o.ts_cframe >= 0 ? w->o.ts_cframe : w->o.ts_frame;
	__s64 lo = fo < w->idoff ? fo : w->idoff;
	__u64 id, fp;
	if (lo >= 0 && fo - lo <= CT_PY_TS_READ - 8 && w->idoff - lo <= CT_PY_TS_READ - 8 &&
	    bpf_probe_read_user(&s->buf[CT_PY_WINDOW], CT_PY_TS_READ, (void *)(ts + lo)) == 0) {
		id = buf_u64(s, CT_PY_WINDOW + ((w->idoff - lo) & (CT_PY_TS_READ - 1)));
		fp = buf_u64(s, CT_PY_WINDOW + ((fo - lo) & (CT_PY_TS_READ - 1)));
	} else {
		id = read_u64(ts + w->idoff);
		fp = read_u64(ts + fo);
	}
	if (id != w->want)
		return 0;
	w->ts = ts;
	if (w->o.ts_cframe >= 0)
		w->frame = fp ? read_u64(fp + w->o.cf_current) : 0;
	else
		w->frame = fp;
	return 1;
}

// py_stack puts the calling thread's Python frames (code object and
// instruction) at block, right after what the record uses (its frames and
// window), as their count, the frames (innermost last) and the count
// again, and flags the record (CT_F_PYTHON | CT_F_PYHEAD); a CPython process's thread without
// Python frames is flagged CT_F_NOPYTHON. The thread state is found by
// native_thread_id from 3.11, by pthread_self (the thread pointer, fsbase
// on x86-64) in 3.10. Code objects are resolved to file:line in user space
// (record/python.go): the walk only follows pointers, a few reads a frame.
//
// use_loop is a constant: 1 walks with bpf_loop (Linux 5.17), whose
// callbacks the verifier checks once; 0 walks with plain bounded loops
// (Linux 5.3), which the verifier follows iteration by iteration, for the
// *_noloop programs that kernels without bpf_loop (5.15, 5.16) load instead
// (loader/variants.go picks them).
static __always_inline void py_stack(struct ct_event *h, __u8 *block, const int use_loop)
{
	__u32 tgid = h->pid, zero = 0;
	struct ct_pyoffsets *o = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!o)
		return;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s)
		return;
	struct py_block *b = &s->b;
	struct py_walk w = {.o = *o, .want = h->tid, .idoff = o->ts_native_id};
	if (o->minor == 10) {
		struct task_struct *t = (void *)bpf_get_current_task();
		w.want = BPF_CORE_READ(t, thread.fsbase);
		w.idoff = o->ts_thread_id;
	}
	struct task_struct___py *task = (void *)bpf_get_current_task();
	struct py_thread me = {.mm = (__u64)BPF_CORE_READ(task, mm), .start = BPF_CORE_READ(task, start_boottime)};
	__u32 tid = h->tid;
	struct py_thread *known = bpf_map_lookup_elem(&py_threads, &tid);
	if (known && known->mm == me.mm && known->start == me.start && ts_take(&w, s, known->ts)) {
		w.found = 1;
	} else {
		__u64 interp = read_u64(o->interp_head);
		if (interp)
			w.ts = read_u64(interp + o->interp_threads);
		if (use_loop) {
			bpf_loop(CT_PY_MAX_THREADS, py_thread_step, &w, 0);
		} else {
			for (int i = 0; i < CT_PY_MAX_THREADS; i++)
				if (thread_step(&w))
					break;
		}
		if (w.found && ts_take(&w, s, w.ts)) {
			me.ts = w.ts;
			bpf_map_update_elem(&py_threads, &tid, &me, BPF_ANY);
		} else {
			w.found = 0;
		}
	}
	b->t.n = 0;
	if (w.found) {
		// shim frames take turns too
		if (use_loop) {
			bpf_loop(CT_PY_MAX_FRAMES + 8, py_frame_step, &w, 0);
		} else {
			for (int i = 0; i < CT_PY_MAX_FRAMES + 8; i++)
				if (frame_step(&w, 0))
					break;
		}
	}
	if (use_loop)
		b->t.n = w.n;
	b->t.pad = 0;
	// Only the counts and the frames in use go to the record: the ring's
	// memory is cold (a 16 MiB ring is written through once per lap), and
	// copying the whole block there cost more than the walk itself.
	// Read back from the map: the verifier of kernels before 6.8 takes a
	// bpf_loop callback to run once, so w.n, which it knows, is 0 or 1 to
	// it, and it would take the copy's length for one of those.
	__u32 n = *(volatile __u32 *)&b->t.n;
	if (n > CT_PY_MAX_FRAMES)
		n = CT_PY_MAX_FRAMES;
	if (n) {
		struct ct_pytrailer *head = (void *)block;
		head->n = n;
		head->pad = 0;
		// One copy of the frames in use, b->f[CT_PY_MAX_FRAMES - n] on.
		bpf_probe_read_kernel(block + sizeof(*head), n * sizeof(struct ct_pyframe),
				      &b->f[CT_PY_MAX_FRAMES - n]);
		struct ct_pytrailer *tail = (void *)(block + sizeof(*head) + n * sizeof(struct ct_pyframe));
		tail->n = n;
		tail->pad = 0;
		h->flags |= CT_F_PYTHON | CT_F_PYHEAD;
	} else {
		h->flags |= CT_F_NOPYTHON;
	}
	py_hold_new_frames(h, s);
}

#endif
