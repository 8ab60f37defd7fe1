// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A traced process's end: one record when its last thread exits, so that
// what it still holds is reported as held at exit and released (the driver
// frees it) in order with the process's other records.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_EXIT_H
#define CT_EXIT_H

// events.ProcessExit, set from Go before load: the one API table is Go's.
const volatile __u16 exit_api = 0;

// The kernel's atomic_t and the one field of signal_struct read here (a
// flavor of common.h's: CO-RE ignores the ___ct suffix).
struct ct_atomic {
	int counter;
} __attribute__((preserve_access_index));

struct signal_struct___ct {
	struct ct_atomic live;
} __attribute__((preserve_access_index));

// Devices whose primary context a process's end forgets (primaries, keyed
// by process and device): more than a node has GPUs.
#define CT_MAX_DEVICES 32

// forget_thread drops what BPF keeps of a thread: its entry (a call it
// ended inside, its latest free, its device), its context stack, its
// CPython thread state. Its thread id may be any other thread's next.
static __always_inline void forget_thread(__u32 tid)
{
	bpf_map_delete_elem(&threads, &tid);
	bpf_map_delete_elem(&ctx_inflight, &tid);
	bpf_map_delete_elem(&ctx_stacks, &tid);
	bpf_map_delete_elem(&py_threads, &tid);
}

// forget_process drops every entry BPF keeps of process tgid but its
// procs entry (the caller's): its place in the PID filter, its Python
// layout, its mappings with unwind rules, and, for a process the reader
// heard of (known: a CUDA process has, from its loader's note of libcuda
// at least), its primary contexts, whose retain counts a later process
// with its PID must not inherit. The reader's own copies of those follow
// its exit record, or its sweep (loader Tracer.Forget).
static __always_inline void forget_process(__u32 tgid, int known)
{
	bpf_map_delete_elem(&pids, &tgid);
	bpf_map_delete_elem(&py_procs, &tgid);
	bpf_map_delete_elem(&uw_procs, &tgid);
	if (!known)
		return;
	for (__s32 dev = 0; dev < CT_MAX_DEVICES; dev++) {
		struct primary_key k = {.tgid = tgid, .dev = dev};
		bpf_map_delete_elem(&primaries, &k);
	}
}

// A process's end, the one BPF knows of: at each traced thread's exit its
// per-thread entries go, and at the last one's the process's, in every
// map; a process the reader heard of (procs) gets one record, after all of
// its others, so that what it still holds is reported as held at exit and
// released, and the reader's state of it ends with it (record's life.go).
// do_exit decrements signal->live, the thread group's threads not yet
// exiting, before this tracepoint: 0 is the group's last thread, past which
// none of the process's threads runs user code, so every record the
// process made is in the ring buffer before this one. Two threads exiting
// at once may both read 0: deleting the process from procs lets only one
// of them through. A later process with the PID is new to every map: it
// is traced only if the filter takes it anew (a traced parent's fork).
SEC("tp_btf/sched_process_exit")
int BPF_PROG(ct_proc_exit, struct task_struct *task)
{
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (!traced(tgid))
		return 0;
	forget_thread(BPF_CORE_READ(task, pid));
	struct signal_struct___ct *sig = (void *)BPF_CORE_READ(task, signal);
	if (BPF_CORE_READ(sig, live.counter) != 0)
		return 0;
	struct ct_proc *p = bpf_map_lookup_elem(&procs, &tgid);
	__u32 flags = p ? p->flags : 0;
	if (!p || bpf_map_delete_elem(&procs, &tgid)) {
		// Nothing sent of it, or another thread ended it first; what
		// the reader may have put in the maps meanwhile goes too.
		if (!p)
			forget_process(tgid, 0);
		return 0;
	}
	forget_process(tgid, 1);
	__u64 id = bpf_get_current_pid_tgid();
	if ((id >> 32) != tgid)
		return 0;
	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		return 0;
	}
	__u16 f = CT_F_ENTRY_ONLY;
	if (!(flags & CT_PROC_RECORDS))
		f |= CT_F_NOTES_ONLY;
	fill_event(e, id, bpf_ktime_get_boot_ns(), 0, exit_api, f, 0, 0, CT_DEV_UNKNOWN, 0);
	if (flags & CT_PROC_RECORDS)
		count(CT_CNT_EVENTS);
	// At once: an agent's per-process figures drop to 0 when it ends.
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

#endif
