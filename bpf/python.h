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

// A CPU's scratch: the block being built; the frame being read, whole
// (masked offsets into it may reach 8 bytes past what is read); and the
// block of the CPU's last record with Python frames, whose frames
// py_hold_new_frames has already looked up.
struct py_scratch_val {
	struct py_block b;
	__u8 fr[CT_PY_FRAME_READ + 8];
	struct py_block last;
	__u32 last_tgid;
	__u32 pad;
};

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, py_scratch, __u32, struct py_scratch_val, 1);

// fr_u64 and fr_u8 take a field from the frame read into s->fr, at an
// offset the loader checked to lie within CT_PY_FRAME_READ.
static __always_inline __u64 fr_u64(struct py_scratch_val *s, __s64 off)
{
	__u64 v;
	__builtin_memcpy(&v, &s->fr[off & (CT_PY_FRAME_READ - 1)], sizeof(v));
	return v;
}

static __always_inline __u8 fr_u8(struct py_scratch_val *s, __s64 off)
{
	return s->fr[off & (CT_PY_FRAME_READ - 1)];
}

// A walk's state, shared with its bpf_loop callbacks: the verifier checks
// a callback once, not once per iteration and branch.
struct py_walk {
	struct ct_pyoffsets o;
	__u64 want; // the thread id a thread state must hold
	__s64 idoff;
	__u64 ts;    // the thread state under examination, then the thread's
	__u64 frame; // the interpreter frame under examination
	__u32 n;     // frames recorded, in the bpf_loop walk (see frame_step)
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
	// One read for the frame's fields: reading them one by one (four or
	// five reads a frame) was most of the walk's cost.
	if (bpf_probe_read_user(s->fr, CT_PY_FRAME_READ, (void *)frame)) {
		// The frame ends within CT_PY_FRAME_READ bytes of the end of its
		// mapping: its fields one by one, where the one read puts them.
		bpf_probe_read_user(&s->fr[w->o.fr_previous & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_previous));
		bpf_probe_read_user(&s->fr[w->o.fr_code & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_code));
		bpf_probe_read_user(&s->fr[w->o.fr_instr & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_instr));
		bpf_probe_read_user(&s->fr[w->o.fr_owner & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_owner));
		bpf_probe_read_user(&s->fr[w->o.fr_entry & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_entry));
	}
	// The bounded-loop walk keeps the count in the scratch map: read from a
	// map it is a number the verifier does not know, so the paths of one
	// step join again at the next; kept in w it was a constant on each
	// path and that walk forked per count, past the verifier's million
	// instructions. The bpf_loop walk keeps it in w, as 6.1's verifier
	// bounds the index below only then (from the map it rejected the
	// callback: R8 unbounded memory access).
	__u32 n = use_loop ? w->n : b->t.n;
	w->frame = fr_u64(s, w->o.fr_previous);
	if (w->o.fr_owner >= 0) {
		if (fr_u8(s, w->o.fr_owner) == 3) { // a shim frame: the run above it ended one C call
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
	f->code = fr_u64(s, w->o.fr_code) & ~(__u64)7;
	f->flags = 0;
	if (w->o.minor == 10) {
		f->units = (__s32)fr_u64(s, w->o.fr_instr); // f_lasti, an int
		f->flags = 1;
	} else {
		__u64 ip = fr_u64(s, w->o.fr_instr);
		// arithmetic shift: BPF has no signed division
		f->units = (__s32)((__s64)(ip - f->code - w->o.co_code_adaptive) >> 1);
		if (w->o.fr_entry >= 0)
			f->flags = fr_u8(s, w->o.fr_entry) ? 1 : 0;
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
	__u32 n = b->t.n;
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

// py_stack puts the calling thread's Python frames (code object and
// instruction) at the end of the record, block being the CT_PY_BLOCK bytes
// reserved there, and flags the record; a CPython process's thread without
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
	b->t.n = 0;
	if (w.found) {
		if (w.o.ts_cframe >= 0) {
			__u64 cf = read_u64(w.ts + w.o.ts_cframe);
			if (cf)
				w.frame = read_u64(cf + w.o.cf_current);
		} else {
			w.frame = read_u64(w.ts + w.o.ts_frame);
		}
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
	__builtin_memcpy(block, b, sizeof(*b));
	h->flags |= b->t.n ? CT_F_PYTHON : CT_F_NOPYTHON;
	py_hold_new_frames(h, s);
}

#endif
