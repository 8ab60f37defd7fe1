// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// CPython processes: the allocating thread's Python frames.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_PYTHON_H
#define CT_PYTHON_H

// CPython processes: their interpreter's layout (see py_stack).
CT_MAP(BPF_MAP_TYPE_HASH, py_procs, __u32, struct ct_pyoffsets, 4096); // key: tgid

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
// cframe pointer) are read in one read, from the first of them to the end
// of the last: they lie within 160 bytes of each other in 3.10-3.14, at
// most CT_PY_TS_READ.
#define CT_PY_TS_READ 256
// 3.11 and 3.12 keep the innermost frame in the thread's current cframe, a
// local of the interpreter loop's C frame, and 3.12 the loop's entry (shim)
// frame beside it (112 bytes above it in pyenv's 3.12.1): for 3.12 the
// walk reads the CT_PY_CF_READ bytes around the cframe (CT_PY_CF_BELOW of
// them below it) at once, which gives the frame and the shim with no read
// of their own. A shim elsewhere is read alone (frame_step).
#define CT_PY_CF_BELOW 256
#define CT_PY_CF_READ 512
// A frame at most this far above the probe's stack pointer is on the
// thread's C stack (the interpreter's entry frames from 3.12): read alone,
// as nothing the walk wants lies beside it.
#define CT_PY_CSTACK (8 << 20)

// Where reads land in buf: the window at 0; the bytes around the cframe;
// a thread state or a frame read alone.
#define CT_PY_BUF_CF CT_PY_WINDOW
#define CT_PY_BUF_ONE (CT_PY_WINDOW + 4096)

// The thread a CPU's last record with Python frames came from, and its
// process's layout (a copy of its py_procs entry): a record of the same
// thread (the same thread id, task and mm) on the same CPU takes them from
// here, with no map lookup. id is 0 while the entry is written: a program
// that preempted one writing it finds it unusable, and one preempted while
// reading it sees id change (py_stack reads id again after the fields).
struct py_cpu_thread {
	__u64 id; // tgid << 32 | tid
	__u64 task;
	__u64 mm;
	__u64 ts;
	__u64 want; // see py_walk
	__s64 idoff;
	struct ct_pyoffsets o;
};

// A CPU's scratch: the block being built; buf, the window
// ([0, CT_PY_WINDOW)), the bytes around the cframe and a frame or thread
// state read alone (CT_PY_BUF_*; masked offsets into it may reach 8 bytes
// past what is read); the block of the CPU's last record with Python
// frames whose code objects were all checked (py_check), with its
// process (last_tgid, last_mm), its interpreter's count of code objects
// freed when it was checked (last_interp, last_gen: py_check; b_interp
// and b_gen, the block being built's) and each
// frame's code object's identity then (last_ident; ident, the block being
// checked's, by the same places); seq, counted up
// by each walk, which tells the record a walk built the block for whether
// another program (a thread that preempted it on this CPU) walked since;
// and the CPU's last Python thread.
struct py_scratch_val {
	struct py_block b;
	__u8 buf[2 * CT_PY_WINDOW + 8] __attribute__((aligned(8)));
	struct py_block last;
	__u64 ident[CT_PY_MAX_FRAMES];
	__u64 last_ident[CT_PY_MAX_FRAMES];
	__u32 last_tgid;
	__u32 pad;
	__u64 last_mm;
	__u64 diff; // not 0: some frame's code object differs from the one at its place in last (the walk's)
	__u64 last_interp; // the last block's interpreter and its count of code objects freed then (0: none known)
	__u64 last_gen;
	__u64 b_interp; // the same of the block being built (ts_take)
	__u64 b_gen;
	__u64 seq;
	struct py_cpu_thread cur;
};

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, py_scratch, __u32, struct py_scratch_val, 1);

// The code objects each process of a CPython 3.10 to 3.13 freed, by its
// PID's slot, where the reader put ct_code_free at its interpreter's
// code_dealloc (pystack/codefree.go): the count py_check compares where
// the interpreter keeps none of its own (3.14 on). Processes that share a
// slot move each other's count: their records read their frames'
// identities again, none takes a freed code object for the one checked.
#define CT_PY_FREE_SLOTS 1024
__u64 py_code_frees[CT_PY_FREE_SLOTS];

// ct_code_free runs as code_dealloc begins, before the object is freed:
// every code object's free goes through it (PyCode_Type's tp_dealloc).
// It runs in whatever process maps the interpreter's file, traced or not.
SEC("uprobe")
int ct_code_free(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__sync_fetch_and_add(&py_code_frees[tgid & (CT_PY_FREE_SLOTS - 1)], 1);
	return 0;
}

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

// buf_u64 and buf_u8 take a field from s->buf, at an offset the mask keeps
// within it. buf_u64 makes one 8-byte load, at an offset the mask also
// keeps 8-byte aligned: the fields it takes are 8-byte aligned in the
// process's memory, and so where each read puts them (a page's start, a
// cframe, a frame). A copy of unknown alignment was compiled to eight
// byte loads and their shifts, 22 instructions a field.
static __always_inline __u64 buf_u64(struct py_scratch_val *s, __u64 idx)
{
	return *(__u64 *)__builtin_assume_aligned(&s->buf[idx & (2 * CT_PY_WINDOW - 8)], 8);
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
	__u64 cflo; // what buf holds at CT_PY_BUF_CF: [cflo, cfhi)
	__u64 cfhi;
	__u64 sp; // the probe's stack pointer
	__u32 found;
	__u32 pad;
};

static __always_inline long thread_step(struct py_walk *w)
{
	if (!w->ts)
		return 1;
	if (ct_py_id_is(read_u64(w->ts + w->idoff), w->want, w->o.minor)) {
		w->found = 1;
		return 1;
	}
	w->ts = read_u64(w->ts + w->o.ts_next);
	return 0;
}

// frame_take puts the frame whose bytes are at base in s->buf at its place
// in the block, the n-th from the innermost.
static __always_inline void frame_take(struct py_walk *w, struct py_scratch_val *s, __u64 base, __u32 n)
{
	// masked for the verifier, which cannot follow n through w; behind a
	// barrier, as the compiler, which knows n < CT_PY_MAX_FRAMES in
	// frame_run's loop, would drop the mask
	__u32 i = CT_PY_MAX_FRAMES - 1 - n;
	barrier_var(i);
	i &= CT_PY_MAX_FRAMES - 1;
	struct ct_pyframe *f = &s->b.f[i];
	// 3.14's f_executable is a _PyStackRef whose low bits tag the
	// reference; earlier versions hold a plain pointer. A code object is
	// at least 8-byte aligned, so the mask is a no-op there, and being
	// branch-free it keeps 6.1's verifier able to bound f in the
	// bounded-loop walk (a `minor >= 14` branch here lost that bound).
	__u64 code = buf_u64(s, base + (w->o.fr_code & (CT_PY_FRAME_READ - 1))) & ~(__u64)7;
	__u64 instr = buf_u64(s, base + (w->o.fr_instr & (CT_PY_FRAME_READ - 1)));
	__s32 units;
	__u32 flags = 0;
	if (w->o.minor == 10) {
		units = (__s32)instr; // f_lasti, an int
		flags = 1;
	} else {
		// arithmetic shift: BPF has no signed division
		units = (__s32)((__s64)(instr - code - w->o.co_code_adaptive) >> 1);
		if (w->o.fr_entry >= 0)
			flags = buf_u8(s, base + (w->o.fr_entry & (CT_PY_FRAME_READ - 1))) ? 1 : 0;
	}
	f->code = code;
	f->units = units;
	f->flags = flags;
	s->diff |= s->last.f[i].code ^ code; // branch-free (see above)
}

static __always_inline long frame_step(struct py_walk *w, const int use_loop)
{
	__u32 zero = 0;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s || !w->frame)
		return 1;
	struct py_block *b = &s->b;
	__u64 frame = w->frame;
	__u64 base = CT_PY_BUF_ONE; // where the frame's bytes are in s->buf
	__u64 end = frame + CT_PY_FRAME_READ;
	// The page's bytes up to the frame's end: the frame's page is mapped,
	// where the one below it may not be (a read that faults costs as much
	// as twenty that do not).
	__u64 len = (frame & (CT_PAGE - 1)) + CT_PY_FRAME_READ;
	if (use_loop && frame >= w->lo && end <= w->hi) {
		base = frame - w->lo; // in the window
	} else if (use_loop && frame >= w->cflo && end <= w->cfhi) {
		base = CT_PY_BUF_CF + (frame - w->cflo); // beside the cframe
	} else if (use_loop && frame - w->sp >= CT_PY_CSTACK &&
		   bpf_probe_read_user(s->buf, len, (void *)(end - len)) == 0) {
		w->lo = end - len;
		w->hi = end;
		base = len - CT_PY_FRAME_READ;
	} else if (bpf_probe_read_user(&s->buf[CT_PY_BUF_ONE], CT_PY_FRAME_READ, (void *)frame)) {
		// One read for the frame's fields: reading them one by one (four
		// or five reads a frame) was most of the walk's cost. Here the
		// frame ends within CT_PY_FRAME_READ bytes of the end of its
		// mapping: its fields one by one, where the one read puts them.
		__u8 *f = &s->buf[CT_PY_BUF_ONE];
		bpf_probe_read_user(&f[w->o.fr_previous & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_previous));
		bpf_probe_read_user(&f[w->o.fr_code & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_code));
		bpf_probe_read_user(&f[w->o.fr_instr & (CT_PY_FRAME_READ - 1)], 8, (void *)(frame + w->o.fr_instr));
		bpf_probe_read_user(&f[w->o.fr_owner & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_owner));
		bpf_probe_read_user(&f[w->o.fr_entry & (CT_PY_FRAME_READ - 1)], 1, (void *)(frame + w->o.fr_entry));
	}
	// The walk keeps the count in the scratch map: read from a map it is a
	// number the verifier does not know, so the paths of one step join
	// again at the next; kept in w it was a constant on each path and the
	// bounded-loop walk forked per count, past the verifier's million
	// instructions (and so did the bpf_loop walk once frame_run took
	// several frames a step). Each index made of it is masked.
	__u32 n = b->t.n;
	w->frame = buf_u64(s, base + (w->o.fr_previous & (CT_PY_FRAME_READ - 1)));
	if (w->o.fr_owner >= 0) {
		if (buf_u8(s, base + (w->o.fr_owner & (CT_PY_FRAME_READ - 1))) == 3) { // a shim frame: the run above it ended one C call
			if (n > 0 && n <= CT_PY_MAX_FRAMES) {
				__u32 i = CT_PY_MAX_FRAMES - n;
				barrier_var(i);
				i &= CT_PY_MAX_FRAMES - 1;
				b->f[i].flags |= 1;
			}
			return !w->frame; // the outermost shim ends the walk
		}
	}
	if (n >= CT_PY_MAX_FRAMES)
		return 1;
	frame_take(w, s, base, n);
	b->t.n = n + 1;
	return !w->frame;
}

// frame_run takes the frames from w->frame on that lie in the window, up
// to CT_PY_RUN of them, and then the shim beside the cframe if that comes
// next (where most walks end), in one step: a frame's step through
// frame_step (a map lookup, the checks of where its bytes are, the walk's
// state kept in memory between steps) cost more than taking it. It stops
// at the first frame frame_step must see: one outside the window and the
// cframe's bytes, or another shim. From 3.12 only, whose frames carry no
// flag of their own (a shim marks the frame before it): with 3.11's
// is_entry and 3.10's f_lasti in the loop its paths were too many for the
// verifier.
#define CT_PY_RUN 8
static __always_inline void frame_run(struct py_walk *w, struct py_scratch_val *s)
{
	if (w->o.minor < 12 || w->o.fr_owner < 0)
		return;
	__u64 frame = w->frame, lo = w->lo, hi = w->hi, cflo = w->cflo, cfhi = w->cfhi;
	__u64 prev = w->o.fr_previous & (CT_PY_FRAME_READ - 1);
	__u64 owner = w->o.fr_owner & (CT_PY_FRAME_READ - 1);
	__u64 codeoff = w->o.fr_code & (CT_PY_FRAME_READ - 1);
	__u64 instroff = w->o.fr_instr & (CT_PY_FRAME_READ - 1);
	__u64 adaptive = w->o.co_code_adaptive;
	__u32 n = s->b.t.n;
	__u64 diff = 0;
	for (int k = 0; k < CT_PY_RUN; k++) {
		if (!frame || n >= CT_PY_MAX_FRAMES || frame < lo || frame + CT_PY_FRAME_READ > hi)
			break;
		__u64 base = frame - lo;
		if (buf_u8(s, base + owner) == 3)
			break;
		// as frame_take does
		__u32 i = CT_PY_MAX_FRAMES - 1 - n;
		barrier_var(i);
		i &= CT_PY_MAX_FRAMES - 1;
		struct ct_pyframe *f = &s->b.f[i];
		__u64 code = buf_u64(s, base + codeoff) & ~(__u64)7;
		__s32 units = (__s32)((__s64)(buf_u64(s, base + instroff) - code - adaptive) >> 1);
		f->code = code;
		f->units = units;
		f->flags = 0;
		diff |= s->last.f[i].code ^ code;
		n++;
		frame = buf_u64(s, base + prev);
	}
	// the shim beside the cframe, as frame_step takes it
	if (frame && frame >= cflo && frame + CT_PY_FRAME_READ <= cfhi) {
		__u64 base = CT_PY_BUF_CF + (frame - cflo);
		if (buf_u8(s, base + owner) == 3) {
			if (n > 0 && n <= CT_PY_MAX_FRAMES) {
				__u32 i = CT_PY_MAX_FRAMES - n;
				barrier_var(i);
				i &= CT_PY_MAX_FRAMES - 1;
				s->b.f[i].flags |= 1;
			}
			frame = buf_u64(s, base + prev);
		}
	}
	w->frame = frame;
	s->b.t.n = n;
	s->diff |= diff;
}

// The bpf_loop (Linux 5.17) callbacks: the verifier checks each once.
static long py_thread_step(__u64 i, void *arg)
{
	return thread_step(arg);
}

static long py_frame_step(__u64 i, void *arg)
{
	if (frame_step(arg, 1))
		return 1;
	__u32 zero = 0;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (s)
		frame_run(arg, s);
	return !((struct py_walk *)arg)->frame;
}

// ts_take says whether ts is the thread's thread state (it holds the
// thread's id: w->want at w->idoff) and, if it is, points w at it and at
// its innermost frame. One read takes both fields where they lie within
// CT_PY_TS_READ bytes of each other.
static __always_inline int ts_take(struct py_walk *w, struct py_scratch_val *s, __u64 ts)
{
	__s64 fo = w->o.ts_cframe >= 0 ? w->o.ts_cframe : w->o.ts_frame;
	__s64 lo = fo < w->idoff ? fo : w->idoff;
	__s64 hi = fo < w->idoff ? w->idoff : fo;
	// The thread state's interpreter too, where py_check wants it (3.14
	// on) and it lies within the same read: 3.14's and 3.15's at 16,
	// below the frame pointer (72).
	__s64 io = w->o.interp_code_gen >= 0 ? w->o.ts_interp : -1;
	if (io >= 0 && io < lo && hi - io <= CT_PY_TS_READ - 8)
		lo = io;
	__u64 id, fp, interp = 0;
	// Only the bytes from the first field to the end of the last: a read's
	// cost grows with its length.
	__u32 len = ((__u32)(hi - lo) & (CT_PY_TS_READ - 8)) + 8;
	if (lo >= 0 && hi - lo <= CT_PY_TS_READ - 8 &&
	    bpf_probe_read_user(&s->buf[CT_PY_BUF_ONE], len, (void *)(ts + lo)) == 0) {
		id = buf_u64(s, CT_PY_BUF_ONE + ((w->idoff - lo) & (CT_PY_TS_READ - 1)));
		fp = buf_u64(s, CT_PY_BUF_ONE + ((fo - lo) & (CT_PY_TS_READ - 1)));
		if (io >= lo)
			interp = buf_u64(s, CT_PY_BUF_ONE + ((io - lo) & (CT_PY_TS_READ - 1)));
	} else {
		id = read_u64(ts + w->idoff);
		fp = read_u64(ts + fo);
	}
	if (!ct_py_id_is(id, w->want, w->o.minor))
		return 0;
	w->ts = ts;
	w->frame = fp;
	// The interpreter's count of code objects freed, for py_check: one
	// read of 8 bytes that spares it one a frame (a thread's frames hold
	// their code objects while it is in the probe, so when in the probe it
	// is read does not matter). Into the map: ct_exit's stack, with
	// ct_py_capture's, is at Linux 6.1's 512 bytes.
	s->b_interp = 0;
	if (interp && bpf_probe_read_user(&s->b_gen, sizeof(s->b_gen), (void *)(interp + w->o.interp_code_gen)) == 0)
		s->b_interp = interp;
	if (w->o.ts_cframe < 0)
		return 1;
	w->frame = 0;
	if (!fp)
		return 1;
	// The bytes around the cframe (see CT_PY_CF_READ) where a shim may lie
	// beside it (3.12: 3.11 has none); a cframe whose surroundings are not
	// all mapped is read alone.
	__u64 cf = fp - CT_PY_CF_BELOW;
	if (w->o.fr_owner >= 0 && w->o.cf_current >= 0 && w->o.cf_current <= CT_PY_CF_BELOW - 8 &&
	    bpf_probe_read_user(&s->buf[CT_PY_BUF_CF], CT_PY_CF_READ, (void *)cf) == 0) {
		w->cflo = cf;
		w->cfhi = cf + CT_PY_CF_READ;
		w->frame = buf_u64(s, CT_PY_BUF_CF + CT_PY_CF_BELOW + (w->o.cf_current & (CT_PY_CF_BELOW - 1)));
	} else {
		w->frame = read_u64(fp + w->o.cf_current);
	}
	return 1;
}

// A walk's outcome, for py_check and py_put: the walk's number (s->seq
// when it ended; 0: the process runs no CPython the reader knows) and the
// process's mm (what tells a process's code objects from those of the
// program it ran before an exec, or of another process with its PID).
struct py_walked {
	__u64 seq;
	__u64 mm;
};

// py_walk walks the calling thread's Python frames (code object and
// instruction) into the CPU's scratch block (s->b, innermost last), for
// py_check to capture the code objects new to the process and py_put to
// copy them into the record: the walk comes before the record is
// reserved, since a capture must precede, in the ring buffer, the record
// that shows its code object. The thread state is found by
// native_thread_id from 3.11, by pthread_self (by the thread pointer:
// arch.h) in 3.10. Code objects are named in user space
// (record/python.go) from what py_check captured: the walk only follows
// pointers. sp is the probe's stack pointer (frames just above it are on
// the C stack).
//
// What a record costs is mostly its reads of the process's memory (about
// 35 ns each on the VMs here, and more with their length): for a CPU's
// last Python thread, three in the common case from 3.11 (the thread
// state's id and frame pointer; the cframe, with 3.12's shim beside it,
// where 3.13 and 3.14 read their shim alone; the page of the data stack
// up to the innermost frame), and one more for each further page,
// generator frame or shim. docs/benchmarks.md has the figures.
//
// use_loop is a constant: 1 walks with bpf_loop (Linux 5.17), whose
// callbacks the verifier checks once; 0 walks with plain bounded loops
// (Linux 5.3), which the verifier follows iteration by iteration, for the
// *_noloop programs that kernels without bpf_loop (5.15, 5.16) load instead
// (loader/variants.go picks them).
static __always_inline struct py_walked py_walk(__u64 id, __u64 sp, const int use_loop)
{
	struct py_walked out = {};
	__u32 tgid = id >> 32, zero = 0;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s)
		return out;
	struct py_block *b = &s->b;
	struct py_cpu_thread *c = &s->cur;
	struct py_walk w = {.sp = sp};
	s->b_interp = 0; // ts_take sets it for the thread it finds
	struct task_struct *task; // its mm and start time: what the caches check
	// This CPU's last Python thread: its thread state and layout without a
	// map lookup (the two cost about 50 ns, a sixth of a short walk).
	// Another thread's record, or a process's first, looks them up.
	if (c->id == id) {
		task = (void *)bpf_get_current_task();
		out.mm = (__u64)BPF_CORE_READ(task, mm);
		if (c->task == (__u64)task && c->mm == out.mm) {
			w.o = c->o;
			w.want = c->want;
			w.idoff = c->idoff;
			w.ts = c->ts;
			barrier();
			if (*(volatile __u64 *)&c->id == id && ts_take(&w, s, w.ts))
				w.found = 1;
		}
	}
	if (!w.found) {
		struct ct_pyoffsets *o = bpf_map_lookup_elem(&py_procs, &tgid);
		if (!o)
			return out;
		w.o = *o;
		w.want = (__u32)id;
		w.idoff = o->ts_native_id;
		if (o->minor == 10) {
			struct task_struct *t = (void *)bpf_get_current_task();
			w.want = ct_thread_pointer(t);
			w.idoff = o->ts_thread_id;
		}
		task = (void *)bpf_get_current_task();
		struct py_thread me = {.mm = (__u64)BPF_CORE_READ(task, mm), .start = BPF_CORE_READ(task, start_boottime)};
		out.mm = me.mm;
		__u32 tid = (__u32)id;
		struct py_thread *known = bpf_map_lookup_elem(&py_threads, &tid);
		if (known && known->mm == me.mm && known->start == me.start && ts_take(&w, s, known->ts)) {
			w.found = 1;
		} else {
			w.ts = 0;
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
		if (w.found) {
			c->id = 0;
			barrier();
			c->task = (__u64)task;
			c->mm = me.mm;
			c->ts = w.ts;
			c->want = w.want;
			c->idoff = w.idoff;
			c->o = w.o;
			barrier();
			c->id = id;
		}
	}
	// A number of the walk's own, so that py_put can tell whether the
	// block is still this walk's: uprobe programs run preemptible (6.0
	// on), and a thread that preempts this one on the CPU may walk into
	// the same scratch.
	out.seq = s->seq + 1;
	s->seq = out.seq;
	s->diff = 0;
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
	b->t.pad = 0;
	return out;
}

// py_put puts the frames py_walk found (pw) at block, right after what
// the record uses (its frames and window), as their count, the frames
// (innermost last) and the count again, and flags the record
// (CT_F_PYTHON | CT_F_PYHEAD); a CPython process's thread without Python
// frames is flagged CT_F_NOPYTHON. A block another walk wrote over since
// (a preempting thread's, on this CPU) is left out, counted: the record
// then says nothing of Python frames, which is absent, not wrong.
static __always_inline void py_put(struct ct_event *h, __u8 *block, struct py_walked pw)
{
	__u32 zero = 0;
	if (!pw.seq)
		return;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	if (!s)
		return;
	struct py_block *b = &s->b;
	// Only the counts and the frames in use go to the record: the ring's
	// memory is cold (a 16 MiB ring is written through once per lap), and
	// copying the whole block there cost more than the walk itself.
	// Read back from the map, as a number the verifier does not know.
	__u32 n = *(volatile __u32 *)&b->t.n;
	if (n > CT_PY_MAX_FRAMES)
		n = CT_PY_MAX_FRAMES;
	if (n) {
		struct ct_pytrailer *head = (void *)block;
		head->n = n;
		head->pad = 0;
		// The frames in use, b->f[CT_PY_MAX_FRAMES - n] on, by loads and
		// stores: bpf_probe_read_kernel copies 8 bytes at a time too, each
		// behind a fault handler.
		__u64 *dst = (void *)(block + sizeof(*head));
		for (int i = 0; i < CT_PY_MAX_FRAMES; i++) {
			if (i >= n)
				break;
			__u32 j = CT_PY_MAX_FRAMES - n + i;
			barrier_var(j);
			j &= CT_PY_MAX_FRAMES - 1;
			dst[2 * i] = *(__u64 *)&b->f[j];
			dst[2 * i + 1] = *((__u64 *)&b->f[j] + 1);
		}
		struct ct_pytrailer *tail = (void *)(block + sizeof(*head) + n * sizeof(struct ct_pyframe));
		tail->n = n;
		tail->pad = 0;
	}
	// Checked after the copy: a walk that preempted this program before
	// it ended counted seq up.
	barrier();
	if (*(volatile __u64 *)&s->seq != pw.seq) {
		count(CT_CNT_PY_PREEMPTED);
		return;
	}
	h->flags |= n ? CT_F_PYTHON | CT_F_PYHEAD : CT_F_NOPYTHON;
}

#endif
