package procmodel

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/jobid"
	"github.com/cudatrace/cudatrace/proc"
)

// identify reads c's job and rank from the environment its process
// started with (proc.Environ: process_vm_readv of the bounds stat shows,
// ptrace access only, no /proc/PID/environ to open; the copies its C
// library keeps where it wrote over that memory, as setproctitle does),
// once: a later capture of the same process (prev) keeps what the first
// read, as an exec keeps the job the process was started in. A capture
// that could not read when its process started (it was exiting: its
// mappings may still read while its stat no longer does) is of the same
// process as prev, whose job it keeps: read again, its environment would
// be gone.
//
// The rest of who it is, its command line and its container, is kept
// from prev too while it runs the same program (prev's, not an exec's
// before it: callers pass the capture read since its last exec): a
// process that renames itself (setproctitle: Ray's "ray::Worker")
// rewrites what /proc/PID/cmdline shows, and what it started with is not
// in its memory any more; one exiting may no longer show its cgroup.
func (c *Capture) identify(prev *Capture) {
	if prev != nil && (prev.Start == c.Start || c.Start == 0) {
		c.Job, c.JobError = prev.Job, prev.JobError
		if prev.Exe == c.Exe || c.Exe == "" {
			if prev.Cmdline != nil {
				c.Cmdline = prev.Cmdline
			}
			if prev.Container != "" {
				c.Container, c.Pod = prev.Container, prev.Pod
			}
		}
		return
	}
	env, err := proc.Environ(int(c.PID))
	switch {
	case errors.Is(err, proc.ErrNoProcess):
		// Gone: the capture says so already (Error).
	case err != nil:
		c.JobError = fmt.Sprintf("%v: its job and rank are unknown", err)
	default:
		c.Job = jobid.FromEnv(env)
	}
}

// Ranked reports whether c's process has a rank in a job.
func (c *Capture) Ranked() bool { return c != nil && c.Job.Ranked() }

// JobID is the job c's process belongs to ("" when none).
func (c *Capture) JobID() string {
	if c == nil || c.Job == nil {
		return ""
	}
	return c.Job.Job
}

// Rank is c's process's rank in its job; -1 when it has none.
func (c *Capture) Rank() int {
	if !c.Ranked() {
		return -1
	}
	return c.Job.Rank
}

// HostPID is the PID the process had on its host: NodePID in a merged
// trace that renumbered it, PID otherwise.
func (c *Capture) HostPID() uint32 {
	if c.NodePID != 0 {
		return c.NodePID
	}
	return c.PID
}

// Title names c's process across ranks and nodes, as the timelines title
// it: "rank 3 · node-b · pid 4242" for a rank of a job (the node only in a
// merged trace), "python3 · node-b · pid 4242" for another process of a
// merged trace, and "python3 (4242)" otherwise, as before there were
// jobs. c may be nil (a process never captured): comm and pid name it.
func Title(c *Capture, pid uint32, comm string) string {
	if c != nil && c.Comm != "" {
		comm = c.Comm
	}
	if c == nil || !c.Ranked() && c.Node == "" {
		return fmt.Sprintf("%s (%d)", comm, pid)
	}
	var parts []string
	if c.Ranked() {
		parts = append(parts, "rank "+strconv.Itoa(c.Job.Rank))
	} else if comm != "" {
		parts = append(parts, comm)
	}
	if c.Node != "" {
		parts = append(parts, c.Node)
	}
	parts = append(parts, "pid "+strconv.FormatUint(uint64(c.HostPID()), 10))
	return strings.Join(parts, " · ")
}

// Identity is c less what a capture reads of its process's memory
// mappings: who the process is (its PID, start, program, command line,
// container, job and rank), to be passed as prev to a later Read, which
// keeps them. It is what a reader keeps of a process read as it started
// that it need not capture (it maps no CUDA yet), at a few hundred bytes
// a process: its identity as it started, should it rename itself
// (setproctitle) before it does.
func (c *Capture) Identity() *Capture {
	if c == nil {
		return nil
	}
	return &Capture{PID: c.PID, PPID: c.PPID, Comm: c.Comm, Cmdline: c.Cmdline, Exe: c.Exe, Time: c.Time, Start: c.Start,
		Container: c.Container, Pod: c.Pod, Job: c.Job, JobError: c.JobError}
}
