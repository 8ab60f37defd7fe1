// Package tracefile writes and reads cudatrace's trace file: a header, then
// self-delimiting, checksummed frames written as events arrive, so a tracer
// killed mid-run leaves a file readable up to its last complete frame.
// docs/trace-format.md is the format's specification; docs/architecture.md
// says who reads and writes it.
package tracefile

import (
	"errors"
	"hash/crc32"
	"time"
)

// Magic opens every trace file. The high first byte and the CR-LF-free tail
// make a text-mode transfer or a wrong file detectable at once (as PNG does).
const Magic = "\x89CUDATRC"

// Version is the format version this package writes. Readers accept files
// of this version; a later version is refused with ErrVersion rather than
// misread.
const Version = 1

// headerSize is Magic, u16 version, u16 flags.
const headerSize = len(Magic) + 4

// MaxFrame bounds one frame's payload. A corrupt length field must not make
// the reader allocate gigabytes.
const MaxFrame = 64 << 20

// Type is a frame's type.
type Type uint8

// Frame types. Event frames carry the BPF record as it came from the ring
// buffer (bpf/cudatrace.h struct ct_event, then nframes u64 return
// addresses), decoded by events.Decode; the others carry JSON, so they can
// grow fields without a version bump.
const (
	TypeMeta     Type = 1
	TypeProcess  Type = 2
	TypeEvent    Type = 3
	TypeCounters Type = 4
	TypeAttach   Type = 5
	TypeEnd      Type = 6
	// TypeNVML is the driver's view of GPU memory (NVML), sampled while
	// recording. Readers older than it skip it, as the format allows.
	TypeNVML Type = 7
	// TypePython resolves the Python frames of a CPython process's events
	// (events.FlagPython): where its interpreter loop is and what each
	// (code object, instruction) of its records is, written before the
	// first event that needs it. Older readers skip it.
	TypePython Type = 8
	// TypeSymbols names native frames of processes that ran with their own
	// root (containers), resolved from their own files while they ran: the
	// reading host may hold other builds at their paths, or nothing. Older
	// readers skip it.
	TypeSymbols Type = 9
)

// lastType is the highest frame type this version reads; higher ones are
// skipped.
const lastType = TypeSymbols

func (t Type) String() string {
	switch t {
	case TypeMeta:
		return "meta"
	case TypeProcess:
		return "process"
	case TypeEvent:
		return "event"
	case TypeCounters:
		return "counters"
	case TypeAttach:
		return "attach"
	case TypeEnd:
		return "end"
	case TypeNVML:
		return "nvml"
	case TypePython:
		return "python"
	case TypeSymbols:
		return "symbols"
	}
	return "unknown"
}

var (
	// ErrNotTrace means the file does not start with Magic.
	ErrNotTrace = errors.New("not a cudatrace trace file")
	// ErrVersion means the file was written by a newer format version.
	ErrVersion = errors.New("unsupported trace format version")
	// ErrTruncated means the file ends inside a frame: the tracer was
	// killed or the disk filled. Every frame before it is intact.
	ErrTruncated = errors.New("trace file truncated")
	// ErrCorrupt means a frame's checksum or length is wrong.
	ErrCorrupt = errors.New("trace file corrupt")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Meta is the first frame: what was traced, where and when.
type Meta struct {
	Tool      string    `json:"tool"`    // "cudatrace <version>"
	Host      string    `json:"host"`    // hostname
	Kernel    string    `json:"kernel"`  // uname release
	StartWall time.Time `json:"start"`   // wall clock at StartBoot
	StartBoot uint64    `json:"boot_ns"` // CLOCK_BOOTTIME ns at start; event times use this clock
	Command   []string  `json:"command,omitempty"`
	PIDs      []int     `json:"pids,omitempty"`
	All       bool      `json:"all,omitempty"`
	// ClockPair is how far apart, in ns, StartBoot was read before and
	// after StartWall: the pairing of the two clocks is good to half of
	// it. 0 in traces written before it was recorded.
	ClockPair uint64 `json:"clock_pair_ns,omitempty"`
	// Clock is the wall clock's synchronization when the trace began; nil
	// where it was not recorded.
	Clock *ClockSync `json:"clock,omitempty"`
	// Nodes, in a trace merged from several (cudatrace merge), are the
	// traces it was made of, each with its host: the other fields then
	// describe the merge (Host empty, StartWall the earliest start,
	// StartBoot the merged clock's reading of it).
	Nodes []Node `json:"nodes,omitempty"`
}

// WallTime converts an event's CLOCK_BOOTTIME timestamp to wall-clock time.
func (m *Meta) WallTime(boot uint64) time.Time {
	return m.StartWall.Add(time.Duration(int64(boot - m.StartBoot)))
}

// Process describes a traced process, written when it is first seen and
// again when its mappings change (dlopen, exec). Readers symbolize an
// event's stack with the latest Process frame before it for its PID. In
// memory a process is package procmodel's Capture, which converts.
type Process struct {
	PID     uint32   `json:"pid"`
	PPID    int      `json:"ppid,omitempty"`
	Comm    string   `json:"comm"`
	Cmdline []string `json:"cmdline,omitempty"`
	Exe     string   `json:"exe,omitempty"`
	Time    uint64   `json:"boot_ns"` // when captured
	// Start is when the process started (CLOCK_BOOTTIME ns, 10 ms
	// precision): a PID that names another process later has another.
	Start uint64    `json:"start_ns,omitempty"`
	Maps  []Mapping `json:"maps"` // executable file mappings, with build IDs
	Root  string    `json:"root,omitempty"`
	// OwnRoot: the process saw another file tree than the tracer (another
	// mount namespace, as a container, or a chroot): the paths in Maps
	// name its files, reached through /proc/PID/root while it lives.
	OwnRoot bool `json:"own_root,omitempty"`
	// The container and Kubernetes pod the process runs in, from its
	// cgroup (package container); empty on the host.
	Container string `json:"container,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Error     string `json:"error,omitempty"` // why the capture is incomplete (the process exited first)
	// Job is the process's place in a distributed job, read once from its
	// environment when it was first seen; nil when it is in none, or its
	// environment could not be read (JobError says why).
	Job      *Job   `json:"job,omitempty"`
	JobError string `json:"job_error,omitempty"`
	// Node is the host the process ran on, in a merged trace (the meta's
	// host otherwise); NodePID its PID there where the merge gave it
	// another (a PID two nodes both had).
	Node    string `json:"node,omitempty"`
	NodePID uint32 `json:"node_pid,omitempty"`
}

// Mapping is one executable file mapping of a Process frame: a line of
// /proc/PID/maps (package proc parses them) and the build ID of the file.
// package procmodel converts it to and from proc.Mapping.
type Mapping struct {
	Start   uint64 `json:"start"`
	End     uint64 `json:"end"`
	Offset  uint64 `json:"offset"` // file offset of Start
	Perms   string `json:"perms"`
	Dev     string `json:"dev,omitempty"` // major:minor, hex, as the kernel prints it
	Inode   uint64 `json:"inode,omitempty"`
	Path    string `json:"path,omitempty"`
	BuildID string `json:"build_id,omitempty"` // hex GNU build ID of Path
}

// Symbols is one batch of native frames named at record time.
type Symbols struct {
	Frames []Symbol `json:"frames"`
}

// Symbol is what the file with build ID BuildID holds at file offset
// Offset: where a return address of a stack fell (address - mapping start +
// mapping offset), so a reader finds it from the process's mappings alone.
type Symbol struct {
	BuildID  string `json:"build_id"`
	Offset   uint64 `json:"offset"`
	VAddr    uint64 `json:"vaddr,omitempty"` // the address in the file's own ELF terms (what addr2line takes)
	Function string `json:"function,omitempty"`
	File     string `json:"file,omitempty"`
	Line     int    `json:"line,omitempty"`
}

// Python is one batch of a CPython process's Python frame facts. A
// process's first one gives its version and Eval; later ones add Codes.
type Python struct {
	PID   uint32 `json:"pid"`
	Minor int    `json:"minor,omitempty"` // CPython 3.Minor
	// Eval are the address ranges of _PyEval_EvalFrameDefault in the
	// process: each of its frames in a native stack runs one run of
	// Python frames (events.PyEntry ends a run).
	Eval  [][2]uint64 `json:"eval,omitempty"`
	Codes []PyCode    `json:"codes,omitempty"`
}

// PyCode is what one (code object, instruction) of a process's records
// stands for.
type PyCode struct {
	Code     uint64 `json:"code"`
	Units    int32  `json:"units"`
	File     string `json:"file"`
	Function string `json:"function"` // qualified name from 3.11
	Line     int    `json:"line"`
	Error    string `json:"error,omitempty"` // why it could not be read (the code object was freed)
	// Renew: a new code object at the address of a freed one; the codes
	// before at that address name none of its frames (pystack.Code).
	Renew bool `json:"renew,omitempty"`
}

// Attach records one library the probes were attached to.
type Attach struct {
	Library string   `json:"library"`
	BuildID string   `json:"build_id,omitempty"`
	Symbols []string `json:"symbols"`
	Missing []string `json:"missing,omitempty"`
	// A library found after tracing began, mapped by a traced process
	// (dlopen): when it was attached, by whom it was found, and how many
	// of that process's events had been seen by then. Calls into the
	// library between its loading and this attach were not traced.
	Time         uint64 `json:"boot_ns,omitempty"`
	PID          uint32 `json:"pid,omitempty"`
	EventsBefore uint64 `json:"events_before,omitempty"`
	// Loaded is when the process mapped the library (CLOCK_BOOTTIME ns,
	// from its dynamic loader's notification: bpf/notify.h); 0 when not
	// known (a periodic scan of its mappings found it). Its calls between
	// Loaded and Time were not traced.
	Loaded uint64 `json:"loaded,omitempty"`
}

// Counters is a snapshot of the BPF side's counters (cumulative since the
// start). The last one in a file is the session's total.
type Counters struct {
	Time     uint64            `json:"boot_ns"`
	Counters map[string]uint64 `json:"counters"`
	Lost     uint64            `json:"lost"`
	// LostStopping: of Lost, those counted after the stop began (probes
	// firing while they were removed); absent in older traces.
	LostStopping uint64 `json:"lost_stopping,omitempty"`
}

// End closes a complete trace. Its absence means the tracer did not stop
// cleanly.
type End struct {
	Time     uint64 `json:"boot_ns"`
	Events   uint64 `json:"events"`
	Reason   string `json:"reason,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
	// Signal names the signal that killed the launched command
	// ("SIGKILL"); ExitCode is then 128 + its number. Absent from
	// traces written before it was added.
	Signal string `json:"signal,omitempty"`
	// Nodes, in a merged trace, say how each trace merged ended, in the
	// order of the meta's Nodes.
	Nodes []NodeEnd `json:"nodes,omitempty"`
}

// NVML is one sample of the driver's view (NVIDIA's management library,
// what nvidia-smi shows): every device's memory and the memory the driver
// charges each process. A sample that could not be taken carries Error
// instead: the first frame of a recording whose host has no NVML says why.
type NVML struct {
	Time      uint64        `json:"boot_ns"`
	Devices   []NVMLDevice  `json:"devices,omitempty"`
	Processes []NVMLProcess `json:"processes,omitempty"`
	Error     string        `json:"error,omitempty"`
}

// NVMLDevice is one GPU in an NVML sample. Index is NVML's (PCI order),
// which may differ from the CUDA ordinal of events: UUID names the GPU.
type NVMLDevice struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name,omitempty"`
	Total uint64 `json:"total"`
	Used  uint64 `json:"used"`
	Free  uint64 `json:"free"`
}

// NVMLProcess is the GPU memory the driver charges one process on one
// device.
type NVMLProcess struct {
	PID    uint32 `json:"pid"`
	Device int    `json:"device"` // NVMLDevice.Index
	UUID   string `json:"uuid,omitempty"`
	Used   uint64 `json:"used"`
}
