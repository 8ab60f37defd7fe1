package tracetest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/merge"
	"github.com/cudatrace/cudatrace/tracefile"
)

// The two nodes of a four-rank job, recorded apart (TwoNodes). Node a
// started recording at Wall with its boot clock at BootA; node b a second
// earlier by the wall clock, with a boot clock that reads 3 hours more (it
// booted earlier). Node a runs ranks 0 and 1 (pids 100 and 101), node b
// ranks 2 and 3 (pids 100, as on a, and 102).
//
// Ranks 0 and 1 allocate 1 and 2 MiB at Wall+1s, rank 1 another 8 MiB
// at Wall+1.5s; ranks 2 and 3 allocate 3 and 4 MiB at Wall. Rank 2 fails
// to allocate 64 GiB (out of memory) at Wall+2s, 3 s into its trace;
// rank 1 fails at Wall+2.5s, 2.5 s into its own: only the wall clocks
// say that rank 2 ran out first (its boot clock is hours ahead, and its
// failure later in its trace). Rank 3 frees what it has at Wall+2.2s.
var (
	Wall  = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	BootA = uint64(1000 * time.Second)
	BootB = uint64(3*time.Hour) + BootA
)

// Ground truth of TwoNodes, per rank: peak and live bytes at the end.
var (
	RankPeak = [4]uint64{1 << 20, 2<<20 + 8<<20, 3 << 20, 4 << 20}
	RankLive = [4]uint64{1 << 20, 2<<20 + 8<<20, 3 << 20, 0}
	// RankHeldAtFirstOOM is what each rank held at wall 2 s, when rank 2
	// ran out first.
	RankHeldAtFirstOOM = [4]uint64{1 << 20, 2<<20 + 8<<20, 3 << 20, 4 << 20}
)

// FirstOOMAfter is the first failure's time after the merged trace's
// start (node b's, Wall-1s); its stack's innermost return address is
// OOMFrame.
const (
	FirstOOMAfter = 3 * time.Second
	OOMFrame      = 0x1234
)

// TwoNodes writes the two traces and returns their paths (node a's,
// node b's).
func TwoNodes(t testing.TB) (string, string) {
	t.Helper()
	job := func(rank int) *tracefile.Job {
		r, l := rank, rank%2
		return &tracefile.Job{ID: "slurm:42.0", Name: "train", Launcher: "slurm", Rank: &r, LocalRank: &l, WorldSize: 4,
			Vars: []string{"SLURM_JOB_ID=42"}}
	}
	proc := func(boot uint64, pid uint32, rank int) *tracefile.Process {
		return &tracefile.Process{PID: pid, Comm: "python3", Time: boot + uint64(500*time.Millisecond),
			Start: boot + uint64(400*time.Millisecond), Job: job(rank),
			Maps: []tracefile.Mapping{{Start: 0x1000, End: 0x2000, Perms: "r-xp", Path: "/opt/train", BuildID: "ab"}}}
	}
	alloc := func(at uint64, pid uint32, addr, size uint64) events.Event {
		return events.Event{Time: at, Duration: 10, PID: pid, TID: pid, Comm: "python3", API: events.CudaMalloc,
			Addr: addr, Size: size, Stack: []uint64{0x1100}}
	}
	oom := func(at uint64, pid uint32) events.Event {
		e := alloc(at, pid, 0, 64<<30)
		e.Result, e.Stack = 2, []uint64{OOMFrame, 0x1100} // cudaErrorMemoryAllocation
		return e
	}
	s := func(d time.Duration) uint64 { return uint64(d) }
	synced := &tracefile.ClockSync{Synced: true, EstError: s(time.Millisecond), MaxError: s(5 * time.Millisecond)}
	a, _ := Write(t, tracefile.Meta{Tool: "t", Host: "node-a", StartWall: Wall, StartBoot: BootA, ClockPair: 2000, Clock: synced},
		proc(BootA, 100, 0), proc(BootA, 101, 1),
		alloc(BootA+s(time.Second), 100, 0x7000_0000, 1<<20),
		alloc(BootA+s(time.Second)+1, 101, 0x7000_0000, 2<<20),
		alloc(BootA+s(1500*time.Millisecond), 101, 0x7100_0000, 8<<20),
		&tracefile.Counters{Time: BootA + s(2*time.Second), Counters: map[string]uint64{"events": 3, "ringbuf_full": 1}, Lost: 1},
		oom(BootA+s(2500*time.Millisecond), 101),
		&tracefile.End{Time: BootA + s(4*time.Second), Events: 4})
	// Node b's times: its start is Wall-1s.
	b, _ := Write(t, tracefile.Meta{Tool: "t", Host: "node-b", StartWall: Wall.Add(-time.Second), StartBoot: BootB,
		ClockPair: 4000, Clock: synced},
		proc(BootB, 100, 2), proc(BootB, 102, 3),
		alloc(BootB+s(time.Second), 100, 0x7000_0000, 3<<20),
		alloc(BootB+s(time.Second)+1, 102, 0x7000_0000, 4<<20),
		oom(BootB+s(3*time.Second), 100),
		events.Event{Time: BootB + s(3200*time.Millisecond), PID: 102, TID: 102, Comm: "python3", API: events.CudaFree,
			Addr: 0x7000_0000, Flags: events.FlagEntryOnly},
		&tracefile.Counters{Time: BootB + s(3500*time.Millisecond), Counters: map[string]uint64{"events": 4}},
		&tracefile.End{Time: BootB + s(4*time.Second), Events: 4})
	return a, b
}

// TwoNodesMerged is TwoNodes' traces merged (node a's first), in a file
// whose path it returns.
func TwoNodesMerged(t testing.TB) string {
	t.Helper()
	a, b := TwoNodes(t)
	var buf bytes.Buffer
	if _, err := merge.Write(&buf, []merge.Input{{Path: a}, {Path: b}}, "t"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "job.trace")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
