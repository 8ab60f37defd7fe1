// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What every program shares: the ring buffer, the pid filter, each thread's
// device, the counters, and how a record is submitted; following forks.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_COMMON_H
#define CT_COMMON_H

// CT_MAP defines a map: kind, name, key and value types, entries. Every map
// of the program is made with it, so a definition is one line.
#define CT_MAP(kind, name, key_t, value_t, entries) \
	struct {                                        \
		__uint(type, kind);                     \
		__uint(max_entries, entries);           \
		__type(key, key_t);                     \
		__type(value, value_t);                 \
	} name SEC(".maps")

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); // overridden from Go
} events SEC(".maps");

// The PID filter (filter_pids): the processes given (loader AddPID) and
// their descendants (ct_fork). A process leaves it at its end (exit.h
// ct_proc_exit), so that a later process given its PID is not traced.
CT_MAP(BPF_MAP_TYPE_HASH, pids, __u32, __u8, 16384); // key: tgid


// A thread's allocation call between its entry and return (alloc.h).
struct inflight {
	__u64 ts_ns;
	__u64 sp; // stack pointer at entry: tells the matching return from a nested one; 0 between calls
	__u64 out;
	__u64 size;
	__u64 aux1; // PITCH: size_t *pitch; 3D: extent.height; VMM_MAP: va
	__u64 aux2; // PITCH: height;        3D: extent.depth;  VMM_MAP: handle
	__u16 api;
	__u16 shape;
	__s32 device;
};

// A thread's latest free, to know the driver's free that a runtime free
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

// What BPF keeps of a thread: the allocation call it is in, its latest
// free, and its device (the CUDA runtime's current device is per thread:
// cudaSetDevice sets it, and the context calls, contexts.h). One entry,
// found by one lookup a probe: in three maps by thread, a pair of
// allocation and free took five lookups, at ~100 ns each on the VMs here
// more than the rest of the entry programs. Made at the thread's first
// traced call, written in place after that (only the thread writes its
// entry), dropped at the thread's end (exit.h forget_thread). A hash map,
// not an LRU: an entry evicted while its thread lives would lose the
// thread's device or a call under way. Its size is Go's (MaxInflight);
// when it is full a thread's calls are counted lost (inflight_full) and
// its device untold.
struct ct_thread {
	struct inflight call;
	struct last_free free;
	// The thread's device: at the entry's making, what current_device
	// says of a thread no call has told (a property of the thread and its
	// process, read once: its task's start time took a kernel read at
	// every record), then what its calls tell.
	__s32 dev;
	__u32 flags; // CT_THREAD_*
};
// Its process's procs entry says CT_PROC_RECORDS (wakeup_flags): the
// thread's later records skip that lookup. Set at the thread's first
// record; an entry is made anew for a thread id used again (forget_thread).
#define CT_THREAD_PROC_RECORDS 1

CT_MAP(BPF_MAP_TYPE_HASH, threads, __u32, struct ct_thread, 16384); // key: tid


// A process the reader has heard of, from its first record or note to its
// end: the one entry BPF keeps of a process's own, made by proc_mark and
// deleted by the kernel's exit (exit.h ct_proc_exit), with the process's
// entries in every other map keyed by process or thread. An LRU: a host
// with more processes than this that each made a record or note loses the
// least recent's entry, and then only its note pacing, the point its
// loader list was read to (read whole again) and its exit record (the
// reader's sweep finds it gone: record's life.go).
struct ct_proc {
	__u64 note_ns; // boot ns of its last library-load note, without the PID filter (notify.h)
	__u64 dl_mm;   // where its last note's walk of its loader's list stopped: the address space,
	__u64 dl_lm;   // and the last entry reported (notify.h dl_report)
	__u32 flags;   // CT_PROC_*
	__u32 pad;
};
#define CT_PROC_RECORDS 1 // it made a record of its own (an allocation, a free, a context call)
#define CT_PROC_NOTED 2   // the reader had a note of it (an exec, a library load)
CT_MAP(BPF_MAP_TYPE_LRU_HASH, procs, __u32, struct ct_proc, 32768); // key: tgid

CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, counters, __u32, __u64, CT_CNT_MAX);


// Only the fields used here; CO-RE finds them in the running kernel's BTF.
// struct thread_struct, the thread pointer's, is the architecture's (arch.h).
struct signal_struct; // exit.h reads the one field it needs

struct mm_struct {
	unsigned long start_stack; // the stack pointer at the program's entry: argc
	unsigned long env_start;   // the environment exec laid out (notify.h ct_exec)
	unsigned long env_end;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	__u64 start_boottime;
	struct thread_struct thread;
	struct signal_struct *signal;
	struct mm_struct *mm;
} __attribute__((preserve_access_index));


// The one field fill_event reads of the current task, through the
// kernel's BTF (bpf_get_current_task_btf: a pointer it may load from).
struct task_struct___comm {
	char comm[16];
} __attribute__((preserve_access_index));

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1; // per-CPU: no atomics needed
}

// proc_mark notes that the reader heard of process tgid (flag, a
// CT_PROC_*) and returns its entry (NULL: no room, counted).
static __always_inline struct ct_proc *proc_mark(__u32 tgid, __u32 flag)
{
	struct ct_proc *p = bpf_map_lookup_elem(&procs, &tgid);
	if (!p) {
		struct ct_proc fresh = {.flags = flag};
		bpf_map_update_elem(&procs, &tgid, &fresh, BPF_NOEXIST);
		p = bpf_map_lookup_elem(&procs, &tgid);
		if (!p)
			count(CT_CNT_MAP_FULL);
		return p;
	}
	// Not atomic (-mcpu=v1 has no atomic or): two threads of the process
	// setting two flags at once may keep one, and the next record or note
	// sets the other again.
	if (!(p->flags & flag))
		p->flags |= flag;
	return p;
}

static __always_inline int traced(__u32 tgid)
{
	if (!filter_pids)
		return 1;
	return bpf_map_lookup_elem(&pids, &tgid) != NULL;
}

// thread_traced is traced(tgid) for a thread whose entry t (NULL: none)
// is in hand: a thread has an entry only where its process was traced
// when it was made (every probe that makes one checks first), and a
// process leaves the filter only at its end, when its threads' entries go
// too (exit.h). So the probes look the thread's entry up first, and the
// filter only for a thread without one: one lookup a probe, not two, for
// a traced thread; two for another process's thread calling the same
// library, as before plus one.
static __always_inline int thread_traced(struct ct_thread *t, __u32 tgid)
{
	return t || traced(tgid);
}

// current_device is the calling thread's device. Of a thread no call has
// told its device (untold_device): 0 for a thread started after tracing began (the runtime's
// default device; the driver's calls fail without a context, and the
// context calls say the device), CT_DEV_UNKNOWN for one that ran before
// (its current context or device was set unseen: learned from its own
// calls, contexts.h), unless its process had no CUDA library loaded when
// tracing began (CT_PID_CUDA_LATER in pids): it chooses under our eyes.
static __always_inline int started_before_tracing(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (BPF_CORE_READ(task, start_boottime) >= trace_start_ns)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 *v = bpf_map_lookup_elem(&pids, &tgid);
	return !(v && *v == CT_PID_CUDA_LATER);
}

// untold_device is the device of a thread no call has told its device.
static __always_inline __s32 untold_device(void)
{
	return started_before_tracing() ? CT_DEV_UNKNOWN : 0;
}

// thread_device is current_device of a thread whose entry (NULL: none)
// is in hand.
static __always_inline __s32 thread_device(struct ct_thread *t)
{
	return t ? t->dev : untold_device();
}

static __always_inline __s32 current_device(__u32 tid)
{
	return thread_device(bpf_map_lookup_elem(&threads, &tid));
}

// thread_get returns thread tid's entry, made (with call, its first
// call, in it) if it has none; NULL where the map is full.
static __always_inline struct ct_thread *thread_get(__u32 tid, struct inflight *call)
{
	struct ct_thread *t = bpf_map_lookup_elem(&threads, &tid);
	if (t)
		return t;
	struct ct_thread fresh = {.dev = untold_device()};
	if (call)
		fresh.call = *call;
	bpf_map_update_elem(&threads, &tid, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &tid);
}

// set_device makes dev thread tid's device.
static __always_inline void set_device(__u32 tid, __s32 dev)
{
	struct ct_thread *t = thread_get(tid, NULL);
	if (!t) {
		count(CT_CNT_MAP_FULL);
		return;
	}
	t->dev = dev;
}

// wakeup_flags says how to submit e, a record reserved at size bytes. A
// process's first record wakes the reader at once, so that it reads
// /proc/PID/maps (and finds its interpreter) while the process lives: one
// that exits right after its first allocations still symbolizes, unless
// it is gone before the reader gets there (counted, record's
// Result.Uncaptured). Nothing is stopped for it: a tracer fails open.
// Otherwise the reader is woken each time the unread data passes a
// multiple of wakeup_bytes: once when it sleeps (it sleeps only once it
// has read all there was), and again for each wakeup_bytes more should it
// miss one. Not at every record while that much is unread: a wakeup costs
// about 5 µs on the VMs here, more than the rest of a record, and the
// reader, behind and awake, does not need one.
//
// t is the thread's entry (NULL: none in hand): once its process is known
// to have made a record, the thread remembers it, and its later records
// skip the process's lookup (~100 ns on the VMs here). A procs entry an
// LRU eviction took (32768 processes with records or notes) is then not
// made again by those threads' records: what it kept is its exit record,
// which the reader's sweep stands in for (record's life.go).
static __always_inline __u64 wakeup_flags(struct ct_event *e, __u32 size, struct ct_thread *t)
{
	if (!t || !(t->flags & CT_THREAD_PROC_RECORDS)) {
		__u32 tgid = e->pid;
		struct ct_proc *p = bpf_map_lookup_elem(&procs, &tgid);
		if (!p || !(p->flags & CT_PROC_RECORDS)) {
			proc_mark(tgid, CT_PROC_RECORDS);
			return BPF_RB_FORCE_WAKEUP;
		}
		if (t)
			t->flags |= CT_THREAD_PROC_RECORDS; // only this thread writes its entry
	}
	// What this record added to the unread data: its size and the ring's
	// 8-byte header, rounded up to 8.
	__u64 added = (size + 8 + 7) & ~7ULL;
	__u64 avail = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	if (wakeup_bytes == 0 || avail < added)
		return BPF_RB_FORCE_WAKEUP;
	if (avail / wakeup_bytes != (avail - added) / wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

// fill_event fills a record's header: the call (api, flags), when it began
// and how long it took, what it is about (addr, size, device, result), and
// the calling thread (id: bpf_get_current_pid_tgid). No frames yet.
static __always_inline void fill_event(struct ct_event *e, __u64 id, __u64 ts, __u64 dur, __u16 api, __u16 flags,
				       __u64 addr, __u64 size, __s32 dev, __s32 result)
{
	e->ts_ns = ts;
	e->dur_ns = dur;
	e->addr = addr;
	e->size = size;
	e->device = dev;
	e->result = result;
	e->api = api;
	e->flags = flags;
	e->nframes = 0;
	e->pid = id >> 32;
	e->tid = (__u32)id;
	// The thread's name read in place: two loads, where
	// bpf_get_current_comm copies it with strscpy_pad (its strnlen and
	// memset took a tenth of a pair's BPF time, docs/benchmarks.md). After
	// its NUL come what the kernel left there (a longer earlier name, on
	// kernels that did not pad it); the reader stops at the NUL.
	struct task_struct___comm *t = (void *)bpf_get_current_task_btf();
	((__u64 *)e->comm)[0] = *(__u64 *)&t->comm[0];
	((__u64 *)e->comm)[1] = *(__u64 *)&t->comm[8];
}

// submit_entry makes and submits a record without a stack, of a call taken
// at its entry (frees, context calls); t is the thread's entry (NULL:
// none in hand).
static __always_inline void submit_entry(__u64 id, __u64 ts, __u16 api, __u64 addr, __u64 size, __s32 dev,
					 struct ct_thread *t)
{
	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		return;
	}
	fill_event(e, id, ts, 0, api, CT_F_ENTRY_ONLY, addr, size, dev, 0);
	count(CT_CNT_EVENTS);
	bpf_ringbuf_submit(e, wakeup_flags(e, sizeof(*e), t));
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
	if (bpf_map_update_elem(&pids, &ctgid, &one, BPF_ANY))
		count(CT_CNT_MAP_FULL); // the filter is full of living processes: this one is not traced
	return 0;
}

#endif
