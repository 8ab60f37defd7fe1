// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Records shared by the BPF programs (cudatrace.bpf.c) and the Go decoder
// (events/decode.go, which mirrors these layouts field for field: change
// both together, and append rather than reorder).
#ifndef CUDATRACE_H
#define CUDATRACE_H

// Frames of user stack kept per allocation. 127 is the kernel's default
// perf_event_max_stack; deeper stacks are cut and flagged CT_F_STACK_TRUNC.
#define CT_MAX_FRAMES 127

// Bytes of user stack an allocation record may carry above its stack
// pointer, for unwinding in user space code built without frame pointers
// (symbolize/unwind). The window a session copies (stack_window in
// cudatrace.bpf.c) is a whole number of pages up to this.
#define CT_MAX_WINDOW (64 << 10)
#define CT_PAGE 4096

// Argument layouts. One program pair serves every function of a layout; the
// attach cookie says which function it is. loader.Shape is this enum
// (bpf2go -type ct_shape generates its Go twin): append, never renumber.
enum ct_shape {
	CT_SHAPE_ALLOC = 1, // (T **out, size_t size, ...): cudaMalloc, cudaMallocHost, cuMemAlloc_v2, ...
	CT_SHAPE_PITCH = 2, // (T **out, size_t *pitch, size_t width, size_t height, ...)
	CT_SHAPE_3D = 3,    // (struct cudaPitchedPtr *out, struct cudaExtent ext) with ext on the stack
	CT_SHAPE_FREE = 4,  // (T *ptr, ...): recorded at entry (ct_free_enter)
	CT_SHAPE_SETDEV = 5, // (int device)
	// Driver contexts; handled by programs of their own (ct_ctx*), no record.
	CT_SHAPE_CTX_RETAIN = 6, // (CUcontext *out, CUdevice dev): cuDevicePrimaryCtxRetain
	CT_SHAPE_CTX_CREATE = 7, // (CUcontext *out, unsigned flags, CUdevice dev): cuCtxCreate, makes it current
	CT_SHAPE_CTX_SET = 8,    // (CUcontext ctx): cuCtxSetCurrent
	CT_SHAPE_CTX_PUSH = 9,   // (CUcontext ctx): cuCtxPushCurrent, the context before it saved
	CT_SHAPE_CTX_POP = 10,   // (CUcontext *out): cuCtxPopCurrent, the saved one current again
	// (CUmemGenericAllocationHandle *out, size_t size, const CUmemAllocationProp *prop, ...):
	// cuMemCreate, on the device prop->location names
	CT_SHAPE_VMM_CREATE = 11,
	// (CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h, ...): cuMemMap;
	// the record carries the handle as its aux value
	CT_SHAPE_VMM_MAP = 12,
	// (T *ptr, size_t size): cuMemUnmap, cuMemAddressFree; recorded at entry like frees
	CT_SHAPE_SIZED_FREE = 13,
	// Contexts that die, each freeing what was allocated in it; records
	// of their own (ct_ctx_record in contexts.h), no return probe.
	CT_SHAPE_CTX_DESTROY = 14,     // (CUcontext ctx): cuCtxDestroy, dies now
	CT_SHAPE_CTX_DETACH = 15,      // (CUcontext ctx): cuCtxDetach, dies at usage count 0
	CT_SHAPE_CTX_ATTACH = 16,      // (CUcontext *out, unsigned flags): one use more of the current one
	CT_SHAPE_PRIMARY_RELEASE = 17, // (CUdevice dev): its primary context dies at the last release
	CT_SHAPE_PRIMARY_RESET = 18,   // (CUdevice dev): its primary context's memory goes now
	CT_SHAPE_DEVICE_RESET = 19,    // (void): cudaDeviceReset, the current device's primary context
	// Calls that tell a thread's current context or device, probed at
	// return while some thread's device or context is unknown (a thread
	// that set its context before tracing began: contexts.h, ct_learn_*).
	CT_SHAPE_LEARN_CTX = 20,    // (CUcontext *out): cuCtxGetCurrent
	CT_SHAPE_LEARN_CTXDEV = 21, // (CUdevice *out): cuCtxGetDevice, the current context's device
	CT_SHAPE_LEARN_RTDEV = 22,  // (int *out): cudaGetDevice, the runtime's current device
	CT_SHAPE_LEARN_POP = 23,    // (CUcontext *out): cuCtxPopCurrent, the context popped
};

// The device of a record whose thread's device is not known: a thread that
// ran before tracing began and has not yet shown which context or device
// is current to it. Never guessed.
#define CT_DEV_UNKNOWN (-1)
// pids values: traced; traced from before it loaded any CUDA library
// (record --pid on a process without CUDA yet: no device chosen unseen).
#define CT_PID_TRACED 1
#define CT_PID_CUDA_LATER 2

enum ct_flags {
	CT_F_ENTRY_ONLY = 1 << 0,  // recorded at entry (frees): no result, no duration
	CT_F_STACK_TRUNC = 1 << 1, // every frame slot was used
	CT_F_WINDOW = 1 << 2,      // a struct ct_ustack and its bytes follow stack[nframes]
	// bit 3: in traces of versions that stopped a process until the reader
	// had read it (SIGSTOP), that it was; never set since, never reused
	// stack[0] holds an argument the header has no field for (cuMemMap's
	// handle); the frames follow it and nframes does not count it
	CT_F_AUX = 1 << 4,
	// the thread's Python frames: with CT_F_PYHEAD right after the frames
	// and window (struct ct_pytrailer, struct ct_pyframe[n], struct
	// ct_pytrailer), else (traces before it) ending the record
	// (struct ct_pyframe[n], then struct ct_pytrailer as its last 8 bytes);
	// see py_stack
	CT_F_PYTHON = 1 << 5,
	// the process runs CPython and the thread had no Python frame (or
	// none the interpreter knows of): a native-only stack, not a lost one
	CT_F_NOPYTHON = 1 << 6,
	// set by user space only (events.FlagBefore): an allocation live when
	// the trace began, made before it
	CT_F_BEFORE = 1 << 7,
	// with CT_F_PYTHON: the Python frames follow the frames and window,
	// their count before them as well as after (so a reader that looks for
	// them at the end of the record still finds them there in a trace,
	// where records are cut to what they use)
	CT_F_PYHEAD = 1 << 8,
	// with CT_F_WINDOW: the link register (x30 on arm64; 0 where it is not
	// known) follows struct ct_ustack, before the window's bytes (arch.h)
	CT_F_LR = 1 << 9,
	// on a ProcessExit record: the process made no record of its own,
	// only notes (an exec, library loads): the reader's state of it ends,
	// the ledger and the trace have nothing of it
	CT_F_NOTES_ONLY = 1 << 10,
	// the frames were unwound in BPF from the call-frame rules the reader
	// loaded (bpf/unwind.h): the whole stack, to its end, not a
	// frame-pointer walk; with CT_F_WINDOW too (--keep-stack-windows) the
	// window is there to unwind it again in user space, the reference
	CT_F_UNWOUND = 1 << 11,
};

// Loss and health counters, a per-CPU array indexed by these.
// loader.CounterNames is indexed by bpf2go's twin of this enum.
enum ct_counter {
	CT_CNT_EVENTS = 0,        // records submitted
	CT_CNT_RB_FULL = 1,       // ring buffer had no room: event lost
	CT_CNT_INFLIGHT_FULL = 2, // no room to remember a call between entry and return: event lost
	CT_CNT_NO_ENTRY = 3,      // return without a recorded entry (attached mid-call): event lost
	CT_CNT_STALE = 4,         // an entry whose return never came (longjmp, thread killed)
	CT_CNT_NESTED = 5,        // traced call made inside another traced call: counted once
	CT_CNT_STACK_ERR = 6,     // the frame-pointer walk met an unreadable frame: stack cut there
	// a code object new to its process could not be captured (no room in
	// the ring buffer): its frames are named from the process's memory
	// while it lives (record/python.go), else left unresolved
	CT_CNT_PYCODE_FULL = 7,
	// a record's Python frames were left out: another program on the CPU
	// (a preempting thread's probe) used the scratch they were built in
	CT_CNT_PY_PREEMPTED = 8,
	// an exec's or a library load's record (notify.h) found no room: the
	// reader learns of it from the next record, or its periodic look
	CT_CNT_NOTE_FULL = 9,
	// a process's state found a map full of living processes' (the PID
	// filter: a child left untraced; py_procs: its Python frames left
	// out; procs: its exit found by the reader's sweep instead)
	CT_CNT_MAP_FULL = 10,
	// stacks unwound in BPF to their end (bpf/unwind.h), and those that
	// fell back to the window copy: a return address in no mapping with
	// rules loaded (no table yet for a library just mapped, JIT code, the
	// vDSO, a process not known yet), or a rule BPF does not follow (a
	// signal frame, a DWARF expression, memory that cannot be read)
	CT_CNT_UW_BPF = 11,
	CT_CNT_UW_NOMAP = 12,
	CT_CNT_UW_RULE = 13,
	// an allocation record kept without its stack window, its native
	// frames from the frame pointers alone: the ring buffer had no room
	// for the window (a burst), but had for the record; the ledger
	// misses nothing, the stack may be shallower
	CT_CNT_RB_NOWINDOW = 14,
	// of the stacks unwound in BPF, those taken from the memo of an
	// earlier unwind from the same place (unwind.h uw_memo), every word
	// it read found unchanged
	CT_CNT_UW_MEMO = 15,
	// a memo of the place found, and a word or register it used changed
	// since: the stack unwound again
	CT_CNT_UW_MEMO_CHANGED = 16,
	CT_CNT_MAX = 17,
};

// USDT probes (PyTorch's pytorch:malloc / pytorch:free): each attached probe
// site has a spec, found by its attach cookie in the usdt_specs array, that
// says where its arguments are, parsed from the ELF note's argument string
// ("-8@%rax 8@-24(%rbp) -4@$1").
#define CT_USDT_MAX_ARGS 4
#define CT_USDT_MAX_SPECS 256

enum ct_usdt_arg_kind {
	CT_USDT_ARG_NONE = 0,
	CT_USDT_ARG_CONST = 1, // val
	CT_USDT_ARG_REG = 2,   // the register at reg_off in struct pt_regs
	CT_USDT_ARG_MEM = 3,   // memory at the register's value + val
};

struct ct_usdt_arg {
	__u8 kind;
	__s8 size; // bytes, negative when signed
	__u16 reg_off;
	__u32 pad;
	__s64 val;
};

struct ct_usdt_spec {
	__u16 api;     // events.API: what the probe reports
	__u16 nargs;
	__u16 is_free; // 1: (ptr), a free; 0: (ptr, device, size, ...), an allocation
	__u16 pad;
	struct ct_usdt_arg args[CT_USDT_MAX_ARGS];
};

// Header of every record in the ring buffer. Allocation records carry
// stack[nframes] after it (after one aux value with CT_F_AUX); free records
// carry nothing more.
struct ct_event {
	__u64 ts_ns;  // bpf_ktime_get_boot_ns() at entry
	__u64 dur_ns; // entry to return, 0 with CT_F_ENTRY_ONLY
	__u64 addr;
	__u64 size;
	__u32 pid; // tgid
	__u32 tid;
	__s32 device;
	__s32 result;
	__u16 api; // events.API, from the attach cookie
	__u16 flags;
	__s32 nframes; // frames in stack[] (a negative errno in traces of versions that used bpf_get_stack)
	char comm[16];
};

struct ct_alloc_event {
	struct ct_event h;
	__u64 stack[CT_MAX_FRAMES];
};

// The registers an unwinder starts from and the stack bytes from sp up,
// placed right after the frames in use (stack[nframes]), so a record keeps
// its frames and window as one prefix of what was reserved. At a return
// probe ip is the return address in the caller and sp, bp are the caller's.
struct ct_ustack {
	__u64 ip;
	__u64 sp;
	__u64 bp;
	__u32 len; // bytes of data that follow, read from sp up: less than the window where the stack ends
	__u32 pad;
	// __u8 data[len];
};

// CPython 3.10 to 3.14: where a process keeps its thread states and how
// its structures are laid out, filled from Go (package pystack) when the
// process is first seen. Offsets are bytes; -1 where the version has none.
#define CT_PY_MAX_FRAMES 32 // a power of two: BPF masks indexes with it
#define CT_PY_MAX_THREADS 32
// The walk reads the first CT_PY_FRAME_READ bytes of an interpreter frame
// at once: every field it needs lies there in 3.10-3.14 (at most 104), and
// Go refuses a layout where one does not (pystack's checkBPF).
#define CT_PY_FRAME_READ 128
// ct_pyoffsets.interp_code_gen of a process whose code objects freed
// ct_code_free counts (pystack's GenFrees).
#define CT_PY_GEN_FREES (-2)

struct ct_pyoffsets {
	__u64 interp_head; // address of _PyRuntime.interpreters.head
	__s64 interp_threads;
	__s64 ts_next;
	__s64 ts_native_id; // 3.11+: matched to the tid
	__s64 ts_thread_id; // 3.10: pthread_self, matched to the thread's fsbase
	__s64 ts_frame;     // 3.10: frame; 3.13: current_frame
	__s64 ts_cframe;    // 3.11, 3.12
	__s64 cf_current;
	__s64 fr_previous;
	__s64 fr_code;
	__s64 fr_instr;   // 3.10: f_lasti (int, code units); else an instruction pointer
	__s64 fr_owner;   // 3.12+: a byte; 3 is a shim frame of a C call into the interpreter
	__s64 fr_entry;   // 3.11: is_entry, a byte
	__s64 co_code_adaptive;
	__u16 minor;
	// 3.14 on (-1 before): the thread state's interpreter
	// (PyThreadState.interp) and that interpreter's count of code objects
	// freed (PyInterpreterState._code_object_generation, a u64 that
	// code_dealloc counts up before it frees one). While it stands still,
	// a code object that a thread's frames held is still the object at
	// its address: py_check takes its identity from the CPU's last block
	// instead of reading it again (bpf/pycode.h). CT_PY_GEN_FREES for 3.10
	// to 3.13, which keep no such count, where the reader probed their
	// code_dealloc: the count is ct_code_free's (py_code_frees). Narrow,
	// where the struct had room: the walk keeps a copy on ct_exit's stack,
	// which with ct_py_capture's is at Linux 6.1's 512 bytes.
	__s16 ts_interp;
	__s32 interp_code_gen;
	// What a code object is named by (the capture, bpf/pycode.h): its
	// file name and (qualified) name, str objects; its line table, a
	// bytes object; its first line, an int. The identity of a code object
	// is those four (py_ident): read again, they tell whether the object
	// at an address is still the one captured there.
	__s64 co_filename;
	__s64 co_name; // co_qualname from 3.11, co_name before
	__s64 co_linetable;
	__s64 co_firstlineno;
};

// One Python frame, innermost first. flags bit 0: the last frame of a run
// that one C call of _PyEval_EvalFrameDefault executes (3.10: every
// frame; 3.11: is_entry; 3.12+: the frame before a shim frame).
struct ct_pyframe {
	__u64 code;  // PyCodeObject * in the process
	__s32 units; // code units from the code's first instruction
	__u32 flags;
};

// The count of a record's Python frames, before them (CT_F_PYHEAD) and
// after them.
struct ct_pytrailer {
	__u32 n; // frames in use: the n struct ct_pyframe between the two counts (right before the last), innermost last
	__u32 pad;
};

// A code object seen for the first time in a process's records (or no
// longer the one seen at its address): what naming its frames takes,
// copied from the process while the thread that runs it is in the probe,
// so it surely lives (bpf/pycode.h). Its own record, before the record
// that showed it, so the reader has it when it reads that one. Each part
// is the object's first bytes, as many as could be read (0: none): an
// object nearer than its size to an unmapped page is read to the page's
// end. events.DecodePyCode mirrors this layout.
#define CT_PYCODE_HEAD 256  // the code object
#define CT_PYCODE_FILE 512  // its file name, a str
#define CT_PYCODE_NAME 256  // its (qualified) name, a str
#define CT_PYCODE_TABLE 4096 // its line table, a bytes object

struct ct_pycode {
	struct ct_event h; // api: events.PyCode; addr: the code object; size: its identity (py_ident)
	__u64 file;        // the objects' addresses, as the code object held them
	__u64 name;
	__u64 table;
	__u32 head_len; // bytes read of each
	__u32 file_len;
	__u32 name_len;
	__u32 table_len;
	__u8 head[CT_PYCODE_HEAD];
	__u8 file_bytes[CT_PYCODE_FILE];
	__u8 name_bytes[CT_PYCODE_NAME];
	__u8 table_bytes[CT_PYCODE_TABLE];
};

// The objects a process's dynamic loader mapped since its last note
// (bpf/notify.h ct_dl_notify), from its list of them (struct link_map,
// glibc's and musl's alike in their first fields): each one's load bias
// and path, read in the process at the moment the loader says the list is
// consistent. A process that exits before the reader reads its mappings
// is still named from them. events.DecodeLoaded mirrors this layout.
#define CT_DL_NAME 256
#define CT_DL_BATCH 16

struct ct_dlobj {
	__u64 lm;   // its struct link_map
	__u64 addr; // l_addr: its load bias
	char name[CT_DL_NAME]; // l_name: its path ("" for the program itself)
};

struct ct_dlobjs {
	struct ct_event h; // api: events.LibrariesMapped; size: objects that follow (0: none known, read the mappings)
	struct ct_dlobj obj[CT_DL_BATCH];
};

// Call-frame rules for unwinding in BPF (bpf/unwind.h), made in user space
// from each file's .eh_frame or .debug_frame (unwind.Compact): one row per
// address range of a file where the rules change, sorted by address within
// the file, all files' rows in one array (uw_rows), each file's a range of
// it. A row holds from its pc to the next row's.
enum ct_uw_cfa {
	CT_UW_CFA_NONE = 0, // no rule BPF follows here (no FDE, an expression, another register): fall back
	CT_UW_CFA_SP = 1,   // CFA = sp + cfa_off
	CT_UW_CFA_FP = 2,   // CFA = fp + cfa_off (rbp, x29)
};
enum ct_uw_reg {
	CT_UW_REG_SAME = 0,   // the frame pointer: unchanged (for the return address, CT_UW_CFA_NONE)
	CT_UW_REG_OFFSET = 1, // saved at CFA + off
	CT_UW_REG_UNDEF = 2,  // the frame pointer: unknown; the return address: none, the stack's end
	CT_UW_REG_LR = 3,     // the return address: still in the link register (arm64)
};

struct ct_uw_row {
	__u32 pc;      // file virtual address where the row starts
	__u8 cfa;      // enum ct_uw_cfa
	__u8 fp;       // enum ct_uw_reg
	__u8 ra;       // enum ct_uw_reg
	__u8 pad;
	__s32 cfa_off;
	__s16 fp_off;
	__s16 ra_off;
};

// A traced process's executable mappings whose file has rows loaded,
// sorted by start (uw_procs, keyed by process): an address a in
// [start, end) is file virtual address a - bias, whose row is the last of
// rows [first, first + nrows) of uw_rows at or below it. The file's
// index (unwind.RowIndex) narrows the search to a bucket's rows: v at or
// above base is in bucket b = (v - base) >> shift, its rows those of
// uw_index[first + b] for b below nbuckets, the last row above; the index
// has the file's room in uw_index that its rows have in uw_rows (nrows + 2
// at most).
// A bucket of a file's index: its row is one of lo to hi (relative to
// the file's first), the rows holding at its start and at the next's. A
// pair, 8 bytes: an array's elements are 8 apart in its memory mapping
// whatever their size.
struct ct_uw_bucket {
	__u32 lo;
	__u32 hi;
};

#define CT_UW_MAPS 512 // a power of two: BPF masks indexes with it
struct ct_uw_map {
	__u64 start;
	__u64 end;
	__u64 bias;
	__u32 first;
	__u32 nrows;
	__u32 base;     // the first row's pc
	__u32 nbuckets; // of 1 << shift bytes each
	__u8 shift;
	__u8 pad[7];
};
struct ct_uw_proc {
	__u32 n; // mappings in use
	__u32 pad;
	// Which writing of the entry this is: every write from Go takes a
	// number no earlier write of any process's took, so that a stack
	// unwound with other mappings (before a dlopen, before an exec, a
	// process before with the same PID) is never taken from the memo
	// (unwind.h uw_memo) for this one.
	__u64 gen;
	struct ct_uw_map maps[CT_UW_MAPS];
};

// An exec's note (ct_exec): the file the process runs now, as exec was
// given it (bprm->filename), and the environment it starts with, its first
// CT_EXEC_ENV bytes (NAME=value strings, each ended by a NUL), copied as
// the process is born: its job and rank as it started, whatever it does
// to that memory after (setproctitle) and however soon it exits, before
// the reader gets to it.
#define CT_EXEC_NAME 256
#define CT_EXEC_ENV 16384
struct ct_exec_note {
	struct ct_event h; // api: events.ProcessExec; addr: the task's start_boottime (ns)
	char filename[CT_EXEC_NAME];
	__u32 env_len; // bytes of env read (0: none could be)
	__u32 pad;
	char env[CT_EXEC_ENV];
};

#endif
