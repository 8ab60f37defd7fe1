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

// do_exit decrements signal->live, the thread group's threads not yet
// exiting, before this tracepoint: 0 is the group's last thread, past which
// none of the process's threads runs user code, so every record the
// process made is in the ring buffer before this one. Two threads exiting
// at once may both read 0: deleting the process from `seen` lets only one
// of them through, and makes a later process with the same PID new again
// (its first record wakes the reader, and may hold it). Only processes
// that made a record: the others have nothing to release.
SEC("tp_btf/sched_process_exit")
int BPF_PROG(ct_proc_exit, struct task_struct *task)
{
	struct signal_struct___ct *sig = (void *)BPF_CORE_READ(task, signal);
	if (BPF_CORE_READ(sig, live.counter) != 0)
		return 0;
	__u32 tgid = BPF_CORE_READ(task, tgid);
	if (bpf_map_delete_elem(&seen, &tgid))
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if ((id >> 32) != tgid)
		return 0;
	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_RB_FULL);
		return 0;
	}
	fill_event(e, id, bpf_ktime_get_boot_ns(), 0, exit_api, CT_F_ENTRY_ONLY, 0, 0, CT_DEV_UNKNOWN, 0);
	count(CT_CNT_EVENTS);
	// At once: an agent's per-process figures drop to 0 when it ends.
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
	return 0;
}

#endif
