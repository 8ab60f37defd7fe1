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
const struct ct_pycode *unused_ct_pycode __attribute__((unused));
const struct ct_dlobjs *unused_ct_dlobjs __attribute__((unused));
const struct ct_uw_row *unused_ct_uw_row __attribute__((unused));
const struct ct_uw_proc *unused_ct_uw_proc __attribute__((unused));
const struct ct_exec_note *unused_ct_exec_note __attribute__((unused));
// And the enums Go uses, for their generated Go constants.
const enum ct_shape *unused_ct_shape __attribute__((unused));
const enum ct_counter *unused_ct_counter __attribute__((unused));
const enum ct_uw_cfa *unused_ct_uw_cfa __attribute__((unused));
const enum ct_uw_reg *unused_ct_uw_reg __attribute__((unused));

// Set from Go before load (spec.Variables).
const volatile __u8 filter_pids = 0;         // 1: only processes in `pids`
const volatile __u8 follow_forks = 1;        // children of traced processes are traced
const volatile __u64 wakeup_bytes = 1 << 20; // wake the reader only past this much unread data
// Bytes of user stack copied into each allocation record for unwinding in
// user space: 0, or a multiple of CT_PAGE up to CT_MAX_WINDOW. The verifier
// sees it as a constant, so records are reserved at the size it makes.
const volatile __u32 stack_window = 0;
// CLOCK_BOOTTIME ns when tracing began: a thread started before it may have
// set its device or context unseen (current_device).
const volatile __u64 trace_start_ns = 0;

// Room for the Python frames in every allocation record: a count, the
// frames, the count again (see py_stack).
#define CT_PY_BLOCK (CT_PY_MAX_FRAMES * sizeof(struct ct_pyframe) + 2 * sizeof(struct ct_pytrailer))

// The programs, by concern. Order matters: each part uses the ones above it.
#include "arch.h"     // what differs between amd64 and arm64
#include "common.h"   // maps and helpers every program shares; ct_fork
#include "stack.h"    // frame-pointer walk, stack window copy
#include "unwind.h"   // unwinding from call-frame rules
#include "python.h"   // Python frames walk
#include "pycode.h"   // Python code objects captured at first sight
#include "alloc.h"    // allocation and free programs
#include "contexts.h" // driver contexts
#include "usdt.h"     // PyTorch's USDT probes
#include "exit.h"     // a traced process's end
#include "notify.h"   // a traced process's exec and library loads
