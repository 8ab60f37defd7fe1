// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// CPython code objects, captured at their first sight in a process's
// records: what naming a frame takes (file, qualified name, first line,
// line table) is copied while the thread that runs the code is in the
// probe, so a code object freed right after (a process that exits, a
// module torn down) is still named, and nothing waits for the reader.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_PYCODE_H
#define CT_PYCODE_H

// events.PyCode, set from Go before load: the one API table is Go's.
const volatile __u16 pycode_api = 0;

struct py_seen_key {
	__u32 tgid;
	__u32 pad;
	__u64 code;
};

// What was captured of a code object: in which address space (the
// process's mm: an exec, or another process with the PID, makes a new
// one) and its identity then (py_ident; 0: its bytes could not be read).
struct py_seen_val {
	__u64 mm;
	__u64 ident;
};

// The code objects each process's records have shown. An LRU: one
// evicted is captured again when next seen.
CT_MAP(BPF_MAP_TYPE_LRU_HASH, py_seen, struct py_seen_key, struct py_seen_val, 65536);

// py_ident is a code object's identity: its file name, name and line
// table objects and its first line. They are set when the object is made
// and never change; a new code object at the address of a freed one has
// other objects there (or the same ones, and then the same names), so a
// capture is never taken for another code object's.
static __always_inline __u64 py_ident(__u64 file, __u64 name, __u64 table, __u32 first)
{
	// rotated apart, so that equal words in two fields do not cancel
	return file ^ (name << 21 | name >> 43) ^ (table << 42 | table >> 22) ^ ((__u64)first * 0x9e3779b97f4a7c15ULL);
}

// The identity's fields lie within CT_PY_IDENT_READ bytes of the first
// of them in 3.10-3.14 (at most 96): py_check reads them at once.
#define CT_PY_IDENT_READ 128

// py_ident_at reads the identity of the code object at code from the
// process: one read of the bytes that hold its fields.
static __always_inline int py_ident_at(struct py_scratch_val *s, const struct ct_pyoffsets *o, __u64 code, __u64 *ident)
{
	__s64 lo = o->co_filename;
	lo = o->co_name < lo ? o->co_name : lo;
	lo = o->co_linetable < lo ? o->co_linetable : lo;
	lo = o->co_firstlineno < lo ? o->co_firstlineno : lo;
	lo &= ~7LL;
	if (lo < 0)
		return -1;
	__u8 *buf = &s->buf[CT_PY_BUF_ONE];
	if (bpf_probe_read_user(buf, CT_PY_IDENT_READ, (void *)(code + lo)))
		return -1;
	__u64 file = *(__u64 *)&buf[(o->co_filename - lo) & (CT_PY_IDENT_READ - 8)];
	__u64 name = *(__u64 *)&buf[(o->co_name - lo) & (CT_PY_IDENT_READ - 8)];
	__u64 table = *(__u64 *)&buf[(o->co_linetable - lo) & (CT_PY_IDENT_READ - 8)];
	__u32 first = *(__u32 *)&buf[(o->co_firstlineno - lo) & (CT_PY_IDENT_READ - 4)];
	*ident = py_ident(file, name, table, first);
	return 0;
}

// read_obj reads up to max bytes of the object at addr into dst: max, or
// where that would cross into an unmapped page, the bytes to the end of
// addr's page (a small object may sit at the end of an arena). It returns
// how many it read (0: none).
static __always_inline __u32 read_obj(void *dst, const __u32 max, __u64 addr)
{
	if (!addr)
		return 0;
	if (bpf_probe_read_user(dst, max, (void *)addr) == 0)
		return max;
	__u32 n = CT_PAGE - (__u32)(addr & (CT_PAGE - 1)); // 1..CT_PAGE
	if (n >= max)
		return 0; // the whole of it was what failed
	if (bpf_probe_read_user(dst, n, (void *)addr) == 0)
		return n;
	return 0;
}

// ct_py_capture captures the code object at code of the calling process
// (id: bpf_get_current_pid_tgid, mm its address space) into a record of
// its own, submitted before the record that showed it, and notes it in
// py_seen once submitted (so that another CPU's record that finds it
// there was reserved after the capture). It says whether it did. A
// global function: the verifier checks it once, not at each of the places
// a record's check loop calls it.
__noinline int ct_py_capture(__u64 code, __u64 id, __u64 mm)
{
	__u32 tgid = id >> 32;
	struct ct_pyoffsets *o = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!o)
		return 0;
	struct py_seen_key k = {.tgid = tgid, .code = code};
	struct py_seen_val v = {.mm = mm};
	struct ct_pycode *r = bpf_ringbuf_reserve(&events, sizeof(*r), 0);
	if (!r) {
		count(CT_CNT_PYCODE_FULL);
		return 0;
	}
	fill_event(&r->h, id, bpf_ktime_get_boot_ns(), 0, pycode_api, CT_F_ENTRY_ONLY, code, 0, 0, 0);
	r->file = r->name = r->table = 0;
	r->file_len = r->name_len = r->table_len = 0;
	r->head_len = read_obj(r->head, CT_PYCODE_HEAD, code);
	__s64 fo = o->co_filename, no = o->co_name, to = o->co_linetable, lo = o->co_firstlineno;
	if (fo < 0 || no < 0 || to < 0 || lo < 0 || fo + 8 > r->head_len || no + 8 > r->head_len ||
	    to + 8 > r->head_len || lo + 4 > r->head_len) {
		// Not a code object this layout reads: noted, never read again.
		bpf_ringbuf_discard(r, 0);
		bpf_map_update_elem(&py_seen, &k, &v, BPF_ANY);
		return 1;
	}
	r->file = *(__u64 *)&r->head[fo & (CT_PYCODE_HEAD - 8)];
	r->name = *(__u64 *)&r->head[no & (CT_PYCODE_HEAD - 8)];
	r->table = *(__u64 *)&r->head[to & (CT_PYCODE_HEAD - 8)];
	__u32 first = *(__u32 *)&r->head[lo & (CT_PYCODE_HEAD - 4)];
	v.ident = py_ident(r->file, r->name, r->table, first);
	r->h.size = v.ident;
	r->file_len = read_obj(r->file_bytes, CT_PYCODE_FILE, r->file);
	r->name_len = read_obj(r->name_bytes, CT_PYCODE_NAME, r->name);
	r->table_len = read_obj(r->table_bytes, CT_PYCODE_TABLE, r->table);
	bpf_ringbuf_submit(r, BPF_RB_NO_WAKEUP); // the record that showed it follows, and wakes the reader as it must
	bpf_map_update_elem(&py_seen, &k, &v, BPF_ANY);
	return 1;
}

// The state of a record's check (py_check), kept in the map: read from a
// map, the counts are numbers the verifier does not know, so the paths of
// one frame's step join again at the next, in the bounded-loop variant too.
struct py_check_val {
	__u32 n;      // frames in the block
	__u32 lastn;  // frames in the CPU's last block, 0 when it is not this process's
	__u32 left;   // captures the record may still make
	__u32 missed; // frames not known captured: a capture failed, or none was left
	__u32 kept;   // no code object freed in the interpreter since the CPU's last block was checked
	__u32 pad;
	__u64 id;
	__u64 mm;
};

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, py_checks, __u32, struct py_check_val, 1);

// check_step checks the j-th frame from the outermost of the CPU's block,
// by the identity its code object has now (py_ident_at; 0: unreadable): a
// code object at the same place in the CPU's last block of the process,
// with the identity it had then, was checked then; one that py_seen has,
// captured in this address space with the identity it still has, was
// captured; any other is captured now. The identity is read each time,
// the same place too: a code object freed and made anew at its address
// between two records (CPython's allocator hands the block out again,
// 3.14 at once) is another code object at the same place. Not read is the
// identity of a code object at the same place in the CPU's last block
// when the interpreter has freed no code object since (c->kept, 3.14 on:
// see py_check): it is the object checked there, whose identity the block
// keeps.
static __always_inline long check_step(__u32 j)
{
	__u32 zero = 0;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	struct py_check_val *c = bpf_map_lookup_elem(&py_checks, &zero);
	if (!s || !c)
		return 1;
	__u32 n = c->n;
	if (j >= n || n > CT_PY_MAX_FRAMES)
		return 1;
	__u32 i = (CT_PY_MAX_FRAMES - n + j) & (CT_PY_MAX_FRAMES - 1);
	__u64 code = s->b.f[i].code;
	__u32 lastn = c->lastn, li = 0;
	int inlast = j < lastn && lastn <= CT_PY_MAX_FRAMES;
	if (inlast) {
		li = (CT_PY_MAX_FRAMES - lastn + j) & (CT_PY_MAX_FRAMES - 1);
		// No code object freed since: the one at this address is the
		// one checked there.
		if (c->kept && s->last.f[li].code == code) {
			s->ident[i] = s->last_ident[li];
			return 0;
		}
	}
	__u64 ident = 0;
	if (py_ident_at(s, &s->cur.o, code, &ident))
		ident = 0;
	s->ident[i] = ident;
	if (inlast && s->last.f[li].code == code && s->last_ident[li] == ident)
		return 0;
	struct py_seen_key k = {.tgid = c->id >> 32, .code = code};
	struct py_seen_val *v = bpf_map_lookup_elem(&py_seen, &k);
	if (v && v->mm == c->mm && v->ident == ident)
		return 0;
	if (c->left == 0) {
		c->missed++;
		return 0;
	}
	c->left--;
	if (!ct_py_capture(code, c->id, c->mm))
		c->missed++;
	return 0;
}

static long py_check_step(__u64 j, void *arg)
{
	return check_step((__u32)j);
}

// py_check captures the code objects of the block py_walk made (pw) that
// the process's records have not shown before, or that are no longer the
// ones captured at their addresses, up to CT_PY_MAX_FRAMES a record. Each
// frame's identity is one read of its code object; a frame with the same
// code object at the same place in the CPU's last block of the process,
// with the same identity, needs no map lookup (a loop allocating from one
// line). Once every frame is known captured, the block becomes the CPU's
// last, with its identities and its interpreter's count of code objects
// freed (s->b_gen, read by ts_take). A block with the same code objects at
// the same places as the last (the walk's diff), none freed since, is
// that block: nothing in it is looked at again.
//
// From 3.14 that count spares the identities' reads (c->kept): CPython's
// code_dealloc (Objects/codeobject.c) counts the freeing thread's
// interpreter's _code_object_generation up before it frees a code object,
// and a frame holds a strong reference to its code object
// (_PyFrame_Initialize: f_executable). A code object in the last block was
// held by the walked thread's frames while the count was read then; for
// another to be made at its address it must be freed first, which moves
// the count (a u64: it never wraps). Read the same, in the same
// interpreter, the address still holds the object checked there. What this
// takes from CPython beyond that: that a thread of another interpreter
// does not free this one's code objects (objects are not shared between
// interpreters). 3.10 to 3.13 keep no such count: where the reader put
// ct_code_free at their code_dealloc, its count of the process's frees
// (py_code_frees) stands for it, moved by the same frees at the same
// moment, before the object goes.
static __always_inline void py_check(struct py_walked pw, __u64 id, const int use_loop)
{
	__u32 zero = 0;
	if (!pw.seq)
		return;
	struct py_scratch_val *s = bpf_map_lookup_elem(&py_scratch, &zero);
	struct py_check_val *c = bpf_map_lookup_elem(&py_checks, &zero);
	if (!s || !c)
		return;
	__u32 n = s->b.t.n, tgid = id >> 32;
	int same = s->last_tgid == tgid && s->last_mm == pw.mm;
	if (!n)
		return;
	// 3.10 to 3.13: ct_code_free's count of the process's frees, read
	// here (ts_take reads 3.14's own): in ts_take it took ct_usdt past
	// arm64's 512 bytes of stack. The walk found the thread (n), so the
	// CPU's last Python thread (cur) is this one, its layout this
	// process's, unless a walk that preempted this one made it another's:
	// then seq moved, and py_put drops the frames. 1 stands for the
	// process's interpreters, which share the count.
	if (s->cur.o.interp_code_gen == CT_PY_GEN_FREES) {
		s->b_gen = *(volatile __u64 *)&py_code_frees[tgid & (CT_PY_FREE_SLOTS - 1)];
		s->b_interp = 1;
	}
	c->kept = same && s->b_interp && s->last_interp == s->b_interp && s->last_gen == s->b_gen;
	// The same code objects at the same places as the CPU's last block of
	// the process (the walk's diff), none freed since: each frame would
	// take its identity from the last block, which stays as it is. A loop
	// allocating from one line costs the walk and no more.
	if (c->kept && !s->diff && s->last.t.n == n)
		return;
	c->n = n;
	c->lastn = same ? s->last.t.n : 0;
	c->left = CT_PY_MAX_FRAMES;
	c->missed = 0;
	c->id = id;
	c->mm = pw.mm;
	if (use_loop) {
		bpf_loop(CT_PY_MAX_FRAMES, py_check_step, NULL, 0);
	} else {
		for (__u32 j = 0; j < CT_PY_MAX_FRAMES; j++)
			if (check_step(j))
				break;
	}
	// A block another walk wrote over meanwhile is not this process's.
	if (*(volatile __u64 *)&s->seq != pw.seq)
		return;
	if (c->missed) {
		s->last.t.n = 0; // every frame looked at again next time
		return;
	}
	__builtin_memcpy(&s->last, &s->b, sizeof(s->last));
	__builtin_memcpy(s->last_ident, s->ident, sizeof(s->last_ident));
	s->last_tgid = tgid;
	s->last_mm = pw.mm;
	s->last_interp = s->b_interp;
	s->last_gen = s->b_gen;
	// A walk that preempted this program while it wrote the last block
	// wrote one of its own: what is there now may be part each's, which
	// the next record must not take as checked.
	barrier();
	if (*(volatile __u64 *)&s->seq != pw.seq)
		s->last.t.n = 0;
}

#endif
