// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A traced process's exec, and its dynamic loader's word that it mapped
// libraries (dlopen, and the libraries it starts with): a record each,
// which wakes the reader at once to read the process's mappings again, so
// that a CUDA library it loads is attached as soon as it is mapped, and
// its interpreter found before its first allocation. Nothing waits for
// the reader: calls made before it attached are what it could not see,
// and the report says so.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_NOTIFY_H
#define CT_NOTIFY_H

// events.ProcessExec and events.LibrariesMapped, set from Go before load.
const volatile __u16 exec_api = 0;
const volatile __u16 mapped_api = 0;

// Without the PID filter (--all, the agent) every process's loads reach
// ct_dl_notify: a record for a process at most every CT_NOTE_GAP_NS (a
// Python import maps hundreds of extension modules; its procs entry's
// note_ns); the reader reads its mappings once more a little after the
// last (record/latescan.go).
#define CT_NOTE_GAP_NS (20 * 1000 * 1000)

static __always_inline void submit_note(__u64 id, __u16 api)
{
	proc_mark(id >> 32, CT_PROC_NOTED);
	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_NOTE_FULL);
		return;
	}
	fill_event(e, id, bpf_ktime_get_boot_ns(), 0, api, CT_F_ENTRY_ONLY, 0, 0, CT_DEV_UNKNOWN, 0);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

// Where each process's walk of its loader's list stopped (its procs
// entry's dl_mm, dl_lm): the last entry it reported, in which address
// space. The next note reports the entries after it: a loader appends
// what it maps (dlclose unlinks, and then the walk, not finding the
// entry, reports the whole list).

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

// A traced process ran another program: the CPython layout of the one
// before no longer holds (its walk would read the new program's memory
// by the old one's addresses), its loader's list is a new one, and the
// reader captures it anew. With the PID filter, a process in it (a
// launched command's first exec, so its interpreter is found before its
// first allocation); without, one that made a record or runs CPython.
SEC("tp_btf/sched_process_exec")
int BPF_PROG(ct_exec, struct task_struct *p, int old_pid, struct linux_binprm *bprm)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!traced(tgid))
		return 0;
	struct ct_proc *pr = bpf_map_lookup_elem(&procs, &tgid);
	if (!filter_pids && !(pr && (pr->flags & CT_PROC_RECORDS)) && !bpf_map_lookup_elem(&py_procs, &tgid))
		return 0;
	bpf_map_delete_elem(&py_procs, &tgid);
	pr = proc_mark(tgid, CT_PROC_NOTED);
	if (pr)
		pr->dl_mm = 0; // a new loader list: the next note walks it all
	struct ct_exec_note *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_NOTE_FULL);
		return 0;
	}
	fill_event(&e->h, id, bpf_ktime_get_boot_ns(), 0, exec_api, CT_F_ENTRY_ONLY, 0, 0, CT_DEV_UNKNOWN, 0);
	e->filename[0] = 0;
	bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), BPF_CORE_READ(bprm, filename));
	// The environment, where exec has just laid it out (its pages are
	// the new stack's, present): read before the process runs a line.
	struct task_struct *task = (void *)bpf_get_current_task();
	struct mm_struct *mm = BPF_CORE_READ(task, mm);
	__u64 lo = BPF_CORE_READ(mm, env_start), hi = BPF_CORE_READ(mm, env_end);
	__u64 n = hi > lo ? hi - lo : 0;
	if (n > CT_EXEC_ENV)
		n = CT_EXEC_ENV;
	e->env_len = 0;
	if (n && !bpf_probe_read_user(e->env, n, (void *)lo))
		e->env_len = n;
	e->h.addr = BPF_CORE_READ(task, start_boottime);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

// Interpreter files whose layout the reader has learned (record/python.go
// setPython), by device (the kernel's encoding) and inode, with
// interp_head relative to the file's load bias: a process whose loader
// maps one gets its layout here, from its loader's list, before its first
// allocation, whatever the reader is busy with.
// -E2BIG: a map full (no errno.h in BPF C).
#define CT_E2BIG 7

struct py_file_key {
	__u64 ino;
	__u32 dev;
	__u32 pad;
};
CT_MAP(BPF_MAP_TYPE_HASH, py_files, struct py_file_key, struct ct_pyoffsets, 256);

struct super_block {
	__u32 s_dev;
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	struct file *vm_file;
} __attribute__((preserve_access_index));

// py_file_of is bpf_find_vma's callback: the file the mapping maps.
static long py_file_of(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct py_file_key *k = data;
	struct file *f = BPF_CORE_READ(vma, vm_file);
	if (f) {
		k->ino = BPF_CORE_READ(f, f_inode, i_ino);
		k->dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	}
	return 0;
}

// py_learn gives the calling process the layout of an interpreter file
// the reader knows, if the object (its dynamic section at ld, loaded with
// bias) is one, and says whether it did. With bpf_loop only (dl_report):
// bpf_find_vma is as new (5.17).
static __always_inline int py_learn(__u32 tgid, __u64 ld, __u64 bias)
{
	struct py_file_key k = {};
	if (!ld || bpf_find_vma(bpf_get_current_task_btf(), ld, py_file_of, &k, 0) || !k.ino)
		return 0;
	struct ct_pyoffsets *o = bpf_map_lookup_elem(&py_files, &k);
	if (!o)
		return 0;
	struct ct_pyoffsets v = *o;
	v.interp_head += bias;
	if (bpf_map_update_elem(&py_procs, &tgid, &v, BPF_NOEXIST) == -CT_E2BIG) {
		count(CT_CNT_MAP_FULL); // as many CPython processes alive as it holds
		return 0;
	}
	return 1;
}

// The objects being reported, a CPU's batch; seq is counted up by each
// note, so that one preempted by another on the CPU (whose batch this
// scratch then is) reports none rather than another's.
struct dl_scratch_val {
	struct ct_dlobjs r;
	__u64 seq;
};
CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, dl_scratch, __u32, struct dl_scratch_val, 1);

// A walk of the loader's list, a CPU's (dl_walks), shared with its
// bpf_loop callback.
struct dl_walk {
	__u64 id;
	__u64 lm;    // the entry under examination
	__u64 after; // report the entries after this one (0: all)
	__u64 last;  // the last entry reported
	__u64 seq;
	__u32 past;  // after is behind
	__u32 n;     // objects in the batch
	__u32 sent;  // objects reported
	__u32 bad;   // the scratch was another note's: report nothing more
	__u32 learn; // look for an interpreter file the reader knows (py_learn)
	__u32 seen;  // entries walked
};

// An interpreter is among a process's first objects (the program, its
// libpython, its C library): a note looks at that many of those reported
// before for one the reader may have learned of since (py_learn).
#define CT_DL_FIRST 8

// The list entries' first fields: glibc's struct link_map, and musl's
// struct dso, which keeps them in the same order for debuggers.
struct dl_entry {
	__u64 l_addr;
	__u64 l_name;
	__u64 l_ld;
	__u64 l_next;
};

static __always_inline void dl_flush(struct dl_walk *w, struct dl_scratch_val *s)
{
	__u32 n = w->n;
	if (!n || n > CT_DL_BATCH)
		return;
	if (*(volatile __u64 *)&s->seq != w->seq) {
		w->bad = 1;
		return;
	}
	fill_event(&s->r.h, w->id, bpf_ktime_get_boot_ns(), 0, mapped_api, CT_F_ENTRY_ONLY, 0, n, CT_DEV_UNKNOWN, 0);
	proc_mark(w->id >> 32, CT_PROC_NOTED);
	if (bpf_ringbuf_output(&events, &s->r, sizeof(s->r.h) + n * sizeof(struct ct_dlobj), BPF_RB_FORCE_WAKEUP))
		count(CT_CNT_NOTE_FULL);
	w->sent += n;
	w->n = 0;
}

// use_loop, a constant: only the bpf_loop variant looks for an
// interpreter (py_learn's bpf_find_vma is as new as bpf_loop), and the
// compiler leaves the call out of the other, whose walk state the
// verifier cannot know (a map's).
static __always_inline long dl_step(struct dl_walk *w, const int use_loop)
{
	__u32 zero = 0;
	struct dl_scratch_val *s = bpf_map_lookup_elem(&dl_scratch, &zero);
	if (!s || !w->lm || w->bad)
		return 1;
	struct dl_entry e = {};
	if (bpf_probe_read_user(&e, sizeof(e), (void *)w->lm))
		return 1;
	if (!w->past) {
		if (use_loop && w->learn && w->seen < CT_DL_FIRST && py_learn(w->id >> 32, e.l_ld, e.l_addr))
			w->learn = 0;
		w->seen++;
		if (w->lm == w->after)
			w->past = 1;
		w->lm = e.l_next;
		return 0;
	}
	__u32 i = w->n & (CT_DL_BATCH - 1);
	struct ct_dlobj *o = &s->r.obj[i];
	o->lm = w->lm;
	o->addr = e.l_addr;
	o->name[0] = 0;
	if (e.l_name)
		bpf_probe_read_user_str(o->name, sizeof(o->name), (void *)e.l_name);
	w->n = i + 1;
	w->last = w->lm;
	if (use_loop && w->learn && py_learn(w->id >> 32, e.l_ld, e.l_addr))
		w->learn = 0;
	if (w->n == CT_DL_BATCH)
		dl_flush(w, s);
	w->lm = e.l_next;
	return 0;
}

static long dl_loop_step(__u64 i, void *arg)
{
	return dl_step(arg, 1);
}

// Entries a note walks at most: a PyTorch process maps some 500 objects.
// Kernels without bpf_loop (5.15, 5.16) walk at most CT_DL_WALK_NOLOOP in
// a bounded loop, with the walk's state in a map (dl_walks): read from a
// map, its fields are numbers the verifier does not know, and the paths of
// one step join again at the next.
#define CT_DL_WALK 4096
#define CT_DL_WALK_NOLOOP 256
CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, dl_walks, __u32, struct dl_walk, 1);

// dl_report reports the objects of the process's loader's list (its head
// at rmap) after the last reported, and says how many it did.
static __always_inline __u32 dl_report(__u64 id, __u64 rmap, const int use_loop)
{
	__u32 zero = 0, tgid = id >> 32;
	struct dl_scratch_val *s = bpf_map_lookup_elem(&dl_scratch, &zero);
	// bpf_loop's callback takes the walk on the stack; the bounded loop,
	// from the map
	struct dl_walk onstack;
	struct dl_walk *w = use_loop ? &onstack : bpf_map_lookup_elem(&dl_walks, &zero);
	if (!s || !w)
		return 0;
	struct task_struct *task = (void *)bpf_get_current_task();
	__u64 mm = (__u64)BPF_CORE_READ(task, mm);
	__builtin_memset(w, 0, sizeof(*w));
	w->id = id;
	w->lm = rmap;
	struct ct_proc *p = bpf_map_lookup_elem(&procs, &tgid);
	if (p && p->dl_mm == mm)
		w->after = p->dl_lm;
	w->past = !w->after;
	// bpf_find_vma is as new as bpf_loop (5.17)
	w->learn = use_loop && !bpf_map_lookup_elem(&py_procs, &tgid);
	w->seq = s->seq + 1;
	s->seq = w->seq;
	for (int pass = 0; pass < 2; pass++) {
		if (use_loop) {
			bpf_loop(CT_DL_WALK, dl_loop_step, w, 0);
		} else {
			for (int i = 0; i < CT_DL_WALK_NOLOOP; i++)
				if (dl_step(w, 0))
					break;
		}
		if (w->past)
			break;
		// the entry last reported was unlinked (dlclose): all of them
		w->lm = rmap;
		w->past = 1;
	}
	dl_flush(w, s);
	__u32 sent = w->sent;
	if (sent && (p = proc_mark(tgid, CT_PROC_NOTED))) {
		p->dl_mm = mm;
		p->dl_lm = w->last;
	}
	return sent;
}

// The dynamic loader's notification point, _dl_debug_state (what
// debuggers break on: glibc's and musl's ld.so call it before and after
// they change the list of mapped objects). The attach cookie is the byte
// offset from it to _r_debug.r_state in the same file (0: not known), so
// that only the call made once the new objects are mapped (RT_CONSISTENT,
// 0) makes a record, with those objects (dl_report); r_map is 16 bytes
// before r_state. Without a cookie, a plain note: the reader reads the
// mappings.
static __always_inline int dl_notify(struct pt_regs *ctx, const int use_loop)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!traced(tgid))
		return 0;
	__s64 delta = (__s64)bpf_get_attach_cookie(ctx);
	int state = -1;
	if (delta && (bpf_probe_read_user(&state, sizeof(state), (void *)(PT_REGS_IP(ctx) + delta)) || state != 0))
		return 0;
	if (!filter_pids) {
		__u64 now = bpf_ktime_get_boot_ns();
		struct ct_proc *p = proc_mark(tgid, CT_PROC_NOTED);
		if (p && p->note_ns && now - p->note_ns < CT_NOTE_GAP_NS)
			return 0;
		if (p)
			p->note_ns = now;
	}
	if (!delta || !dl_report(id, read_u64(PT_REGS_IP(ctx) + delta - 16), use_loop))
		submit_note(id, mapped_api);
	return 0;
}

SEC("uprobe")
int ct_dl_notify(struct pt_regs *ctx)
{
	return dl_notify(ctx, 1);
}

SEC("uprobe")
int ct_dl_notify_noloop(struct pt_regs *ctx)
{
	return dl_notify(ctx, 0);
}

#endif
