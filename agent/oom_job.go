package agent

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cudatrace/cudatrace/container"
	"github.com/cudatrace/cudatrace/export"
)

// The OOM black box of a rank of a distributed job is named by its job
// and rank: a job's dumps, one per rank that ran out, sort together, and
// say which rank each is without opening it.

// base names the dump's files: oom-PID-TIME, or, for a rank of a job,
// oom-JOB-rankN-PID-TIME (the job's ID with what a file name should not
// hold replaced by '_').
func (d *oomDump) base() string {
	at := d.time.UTC().Format("20060102T150405.000000000Z")
	j := d.proc.Job
	if j == nil || j.Rank == nil {
		return fmt.Sprintf("oom-%d-%s", d.pid, at)
	}
	job := fileSafe(j.ID)
	if job != "" {
		job += "-"
	}
	return fmt.Sprintf("oom-%srank%d-%d-%s", job, *j.Rank, d.pid, at)
}

// maxJobInName bounds the job's part of a dump's file name.
const maxJobInName = 64

// fileSafe keeps letters, digits, '.', '-' and '_' of s, '_' for the
// rest ("slurm:42.0" is "slurm_42.0"), at most maxJobInName bytes.
func fileSafe(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > maxJobInName {
		b = b[:maxJobInName]
	}
	return strings.TrimLeft(string(b), ".")
}

// who names the process in the agent's line: its comm, and its rank and
// job where it has them.
func (d *oomDump) who() string {
	j := d.proc.Job
	if j == nil || j.Rank == nil {
		return d.proc.Comm
	}
	s := d.proc.Comm + ", rank " + strconv.Itoa(*j.Rank)
	if j.ID != "" {
		s += " in " + j.ID
	}
	return s
}

// labels are the dump's profile's labels: the process's container and
// pod, and its job and rank.
func (d *oomDump) labels() map[string]string {
	return export.JobLabels(profileLabels(container.Info{ID: d.proc.Container, PodUID: d.proc.PodUID}, d.names), d.first)
}
