package events

// Event is one traced call, decoded. Times are CLOCK_BOOTTIME nanoseconds
// (bpf_ktime_get_boot_ns), the clock trace files convert to wall time.
type Event struct {
	Time     uint64 // call entry
	Duration uint64 // entry to return; 0 for calls recorded at entry only (frees)
	PID      uint32 // thread group id, what users call the PID
	TID      uint32
	Comm     string
	API      API
	Addr     uint64 // allocated or freed address; 0 for a failed allocation
	Size     uint64 // bytes; for pitch and 3D allocations the bytes actually reserved
	Device   int32  // CUDA device ordinal current on the calling thread
	Result   int32  // cudaError_t / CUresult; 0 is success
	Flags    uint16
	Aux      uint64   // with FlagAux: an argument the header has no field for (cuMemMap's handle)
	Stack    []uint64 // user return addresses, innermost first
	StackErr int32    // a negative errno in place of a stack (traces from recorders that used bpf_get_stack); 0 otherwise
	// With FlagWindow: the registers at the probe and the user stack bytes
	// from Regs.SP up, for unwinding code without frame pointers in user
	// space (package unwind). Decode leaves Window in the record's bytes:
	// valid while they are (a live record: until the handler returns).
	Regs   Regs
	Window []byte
	// With FlagPython: the thread's CPython frames, innermost first, as BPF
	// found them; record resolves their code objects to file:line.
	Py []PyFrame
}

// PyFrame is one CPython interpreter frame: its code object in the process
// and the instruction it stands at.
type PyFrame struct {
	Code  uint64 // PyCodeObject *
	Units int32  // code units from the code's first instruction
	Flags uint32 // PyEntry
}

// PyEntry marks the outermost frame of the run one C call of the
// interpreter loop (_PyEval_EvalFrameDefault) executes.
const PyEntry uint32 = 1

// Regs are the user registers an unwinder starts from. At a return probe IP
// is the return address in the caller, and SP and BP (the frame pointer:
// rbp, arm64's x29) are the caller's. LR is arm64's link register (x30),
// recorded at a probe inside a function (USDT), where a function that has
// not saved it yet keeps its return address there; 0 where it is not
// known (at a return probe, and on x86-64, which has none).
type Regs struct {
	IP, SP, BP uint64
	LR         uint64
}

// Event flags, as set by the BPF programs (bpf/cudatrace.h CT_F_*).
const (
	FlagEntryOnly  uint16 = 1 << 0 // recorded at entry: no result, no duration
	FlagStackTrunc uint16 = 1 << 1 // the stack filled every frame slot and may go deeper
	FlagWindow     uint16 = 1 << 2 // registers and a window of user stack follow the frames
	FlagHeld       uint16 = 1 << 3 // in traces of versions that stopped a process for its reader, a record it was stopped at; never set since
	FlagAux        uint16 = 1 << 4 // the first stack slot holds Aux; the frames follow
	FlagPython     uint16 = 1 << 5 // the thread's Python frames (Py) follow the frames and window (FlagPyHead), or end the record
	FlagNoPython   uint16 = 1 << 6 // a CPython process's thread with no Python frame
	// An allocation live when the trace began, made before it (an agent's
	// /trace window starts with the agent's live set): written by user
	// space, never by BPF. Its stack is the ledger's, Python frames merged.
	FlagBefore uint16 = 1 << 7
	// With FlagPython: the Python frames' count comes before them as well
	// as after, and they follow the frames and window (BPF writes them
	// there, not at the end of the room it reserves). Without it (traces
	// written before) they end the record.
	FlagPyHead uint16 = 1 << 8
	// With FlagWindow: the link register (Regs.LR) follows the registers,
	// before the window's bytes (arm64's records).
	FlagLR uint16 = 1 << 9
	// FlagNotesOnly, on a ProcessExit: the process made no record of its
	// own, only notes (an exec, library loads): the reader's state of it
	// ends; the ledger and the trace have nothing of it (CT_F_NOTES_ONLY).
	FlagNotesOnly uint16 = 1 << 10
	// FlagUnwound: the frames were unwound in BPF from call-frame rules
	// (bpf/unwind.h), to the stack's end: the stack, not a frame-pointer
	// walk. With FlagWindow too (--keep-stack-windows) the window is
	// there for user space to unwind as the reference (CT_F_UNWOUND).
	FlagUnwound uint16 = 1 << 11
)

// End is when the call's effect on memory takes hold: frees at entry (the
// memory may be reused as soon as the call runs), allocations at return.
func (e *Event) End() uint64 { return e.Time + e.Duration }

// OK reports whether the call succeeded.
func (e *Event) OK() bool { return e.Result == 0 }
