package tracefile

import "time"

// Job is a process's place in a distributed job (in memory, package
// jobid's Identity, which procmodel converts). Rank, LocalRank and
// NodeRank are absent when unknown (0 is a rank).
type Job struct {
	ID        string   `json:"id,omitempty"`   // shared by every process of the job: "slurm:4242.0"
	Name      string   `json:"name,omitempty"` // the scheduler's name for it
	Launcher  string   `json:"launcher,omitempty"`
	Role      string   `json:"role,omitempty"`
	Rank      *int     `json:"rank,omitempty"`
	LocalRank *int     `json:"local_rank,omitempty"`
	WorldSize int      `json:"world_size,omitempty"`
	NodeRank  *int     `json:"node_rank,omitempty"`
	Vars      []string `json:"vars,omitempty"` // the variables it was read from, NAME=value
}

// ClockSync is the wall clock's synchronization as the kernel reported it
// (adjtimex(2)) when a trace began.
type ClockSync struct {
	// Synced: an NTP or PTP daemon disciplines the clock (the kernel's
	// STA_UNSYNC bit is clear).
	Synced bool `json:"synced"`
	// EstError and MaxError are the kernel's estimated and maximum
	// error of the wall clock, in ns, as the daemon last set them.
	EstError uint64 `json:"est_error_ns,omitempty"`
	MaxError uint64 `json:"max_error_ns,omitempty"`
}

// Node is one trace of a merged trace: where and when it was recorded,
// and how its times were moved onto the merged clock.
type Node struct {
	Host      string     `json:"host"`
	Kernel    string     `json:"kernel,omitempty"`
	Tool      string     `json:"tool,omitempty"`
	Trace     string     `json:"trace"` // the file merged (its path as given)
	StartWall time.Time  `json:"start"`
	StartBoot uint64     `json:"boot_ns"`
	ClockPair uint64     `json:"clock_pair_ns,omitempty"`
	Clock     *ClockSync `json:"clock,omitempty"`
	// Offset is what was added to each of its times (CLOCK_BOOTTIME of
	// its host) to put them on the merged clock: the merged clock reads
	// wall-clock time, less a constant.
	Offset int64 `json:"offset_ns"`
}

// NodeEnd is how one trace of a merged trace ended.
type NodeEnd struct {
	Host     string `json:"host"`
	Events   uint64 `json:"events"`
	Lost     uint64 `json:"lost,omitempty"`
	Complete bool   `json:"complete"` // it had its end frame
	// Warning says why it stopped short (truncated, damaged) or
	// what else went wrong reading it.
	Warning string `json:"warning,omitempty"`
	Reason  string `json:"reason,omitempty"` // its own end frame's
}
