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
// Python import maps hundreds of extension modules); the reader reads its
// mappings once more a little after the last (record/latescan.go).
#define CT_NOTE_GAP_NS (20 * 1000 * 1000)
CT_MAP(BPF_MAP_TYPE_LRU_HASH, noted, __u32, __u64, 4096); // key: tgid; value: boot ns of its last record

static __always_inline void submit_note(__u64 id, __u16 api)
{
	struct ct_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count(CT_CNT_NOTE_FULL);
		return;
	}
	fill_event(e, id, bpf_ktime_get_boot_ns(), 0, api, CT_F_ENTRY_ONLY, 0, 0, CT_DEV_UNKNOWN, 0);
	bpf_ringbuf_submit(e, BPF_RB_FORCE_WAKEUP);
}

// A traced process ran another program: the CPython layout of the one
// before no longer holds (its walk would read the new program's memory
// by the old one's addresses), and the reader captures the new one. With
// the PID filter, a process in it (a launched command's first exec, so
// its interpreter is found before its first allocation); without, one
// that made a record or runs CPython.
SEC("tp_btf/sched_process_exec")
int BPF_PROG(ct_exec)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (filter_pids) {
		if (!bpf_map_lookup_elem(&pids, &tgid))
			return 0;
	} else if (!bpf_map_lookup_elem(&seen, &tgid) && !bpf_map_lookup_elem(&py_procs, &tgid)) {
		return 0;
	}
	bpf_map_delete_elem(&py_procs, &tgid);
	submit_note(id, exec_api);
	return 0;
}

// The dynamic loader's notification point, _dl_debug_state (what
// debuggers break on: glibc's and musl's ld.so call it before and after
// they change the list of mapped objects). The attach cookie is the byte
// offset from it to _r_debug.r_state in the same file (0: not known), so
// that only the call made once the new objects are mapped (RT_CONSISTENT,
// 0) makes a record.
SEC("uprobe")
int ct_dl_notify(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (filter_pids && !bpf_map_lookup_elem(&pids, &tgid))
		return 0;
	__s64 delta = (__s64)bpf_get_attach_cookie(ctx);
	if (delta) {
		int state = -1;
		if (bpf_probe_read_user(&state, sizeof(state), (void *)(PT_REGS_IP(ctx) + delta)) || state != 0)
			return 0;
	}
	if (!filter_pids) {
		__u64 now = bpf_ktime_get_boot_ns();
		__u64 *last = bpf_map_lookup_elem(&noted, &tgid);
		if (last && now - *last < CT_NOTE_GAP_NS)
			return 0;
		bpf_map_update_elem(&noted, &tgid, &now, BPF_ANY);
	}
	submit_note(id, mapped_api);
	return 0;
}

#endif
