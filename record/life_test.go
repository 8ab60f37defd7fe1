package record

import (
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/cudatrace/cudatrace/events"
	"github.com/cudatrace/cudatrace/ledger"
	"github.com/cudatrace/cudatrace/proc"
	"github.com/cudatrace/cudatrace/procmodel"
)

// gonePID is above pid_max's default and its largest: never a process.
const gonePID = 1<<22 + 7

// lifeSession is a session of every process (--all) without a tracer or a
// trace, watched by log.
func lifeSession(log *eventLog) *session {
	s := newState(Options{All: true, Stderr: io.Discard, Observer: log}, &Result{Ledger: ledger.New()})
	return s
}

// record hands the session ev encoded as BPF writes it.
func (s *session) recordEvent(ev events.Event) {
	s.Record(events.Encode(nil, &ev))
}

// A process ends once, by the one path: its exit record ends every piece
// of state the session keeps of it, and one that made only notes (BPF's
// FlagNotesOnly) reaches neither the ledger nor the observers.
func TestExitRecordEndsLife(t *testing.T) {
	var log eventLog
	s := lifeSession(&log)
	// Heard of through a note only (its life born by it), and then its end.
	s.lifeOf(gonePID).exe = "/usr/bin/true"
	s.learn.pending = map[thread]struct{}{{gonePID, gonePID + 1}: {}, {gonePID + 1, 9}: {}}
	s.recordEvent(events.Event{Time: 10, PID: gonePID, TID: gonePID, API: events.ProcessExit,
		Flags: events.FlagEntryOnly | events.FlagNotesOnly, Device: events.DeviceUnknown})
	if len(s.lives) != 0 || len(log.got) != 0 || s.res.Ledger.Process(gonePID) != nil || s.events != 0 {
		t.Errorf("a notes-only process's end: lives %v, observer saw %d events, ledger %v, %d events counted",
			s.lives, len(log.got), s.res.Ledger.Process(gonePID), s.events)
	}
	if _, ok := s.learn.pending[thread{gonePID, gonePID + 1}]; ok || len(s.learn.pending) != 1 {
		t.Errorf("learning pending after its end: %v, want only the other process's thread", s.learn.pending)
	}

	// A process that allocated: its exit record is the ledger's, and then
	// its life is over; its model goes with it under --all.
	pid := uint32(gonePID + 1)
	s.lifeOf(pid).rec = &liveProc{p: s.procs.Add(&procmodel.Capture{PID: pid, Comm: "job"})}
	s.recordEvent(events.Event{Time: 20, PID: pid, TID: pid, Comm: "job", API: events.CudaMalloc, Addr: 0x1000, Size: 64,
		Stack: []uint64{0x401000}})
	s.recordEvent(events.Event{Time: 30, PID: pid, TID: pid, Comm: "job", API: events.ProcessExit,
		Flags: events.FlagEntryOnly, Device: events.DeviceUnknown})
	p := s.res.Ledger.Process(pid)
	if p == nil || !p.Exited || p.HeldAtExitBytes != 64 {
		t.Errorf("ledger after the exit record: %+v", p)
	}
	if len(s.lives) != 0 || s.procs.Get(pid) != nil || len(log.got) != 2 {
		t.Errorf("after its exit record: lives %v, model %v, observer saw %d events (want 2)", s.lives, s.procs.Get(pid), len(log.got))
	}
}

// The sweep ends what no exit record did: a process gone (its record lost
// to a full ring buffer), once it has been gone a while (records of it
// may still be unread), through the ledger and the observers as its exit
// record would, counted; and a process whose PID another process has
// now (its start time is not the one known). A living process stays.
func TestSweepEndsUnseen(t *testing.T) {
	var log eventLog
	s := lifeSession(&log)
	self := uint32(os.Getpid())
	start, err := proc.StartTime(int(self))
	if err != nil {
		t.Fatal(err)
	}
	s.lifeOf(self).start = start
	s.lifeOf(gonePID).rec = &liveProc{p: s.procs.Add(&procmodel.Capture{PID: gonePID, Comm: "gone"})}
	s.recordEvent(events.Event{Time: 20, PID: gonePID, TID: gonePID, Comm: "gone", API: events.CudaMalloc, Addr: 0x1000,
		Size: 7, Stack: []uint64{0x401000}})
	parent := uint32(os.Getppid())
	s.lifeOf(parent).start = 1 // another process had this PID once
	s.sweep()
	if len(s.lives) != 3 || s.res.ExitsSwept != 0 {
		t.Fatalf("first sweep: %d lives, %d swept; want 3 (gone ones wait pendingAfterExit), 0", len(s.lives), s.res.ExitsSwept)
	}
	for _, l := range s.lives {
		if l.gone != 0 {
			l.gone -= uint64(pendingAfterExit) // as if found gone that long ago
		}
	}
	s.lastSweep = time.Time{}
	s.sweep()
	if len(s.lives) != 1 || s.lives[self] == nil {
		t.Errorf("after the sweeps: lives %v, want only pid %d", s.lives, self)
	}
	p := s.res.Ledger.Process(gonePID)
	if p == nil || !p.Exited || p.HeldAtExitBytes != 7 || p.Live != 0 || s.res.ExitsSwept != 1 {
		t.Errorf("gone after the sweep: %+v, %d swept", p, s.res.ExitsSwept)
	}
	if n := len(log.got); n != 2 || log.got[1].API != events.ProcessExit || log.got[1].PID != gonePID {
		t.Errorf("the observer saw %d events (%v), want the allocation and gone's exit", n, log.got)
	}
}

// A process that has exited but is not reaped yet (a zombie: its stat
// reads on, with its start time) is gone: a --pid target that is one ends
// the recording, and the sweep ends its life.
func TestZombieIsGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait() //nolint:errcheck // reaped at the end only
	start, err := proc.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); proc.Alive(pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("true did not exit within 10s")
		}
	}
	if st, err := proc.StartTime(pid); err != nil || st != start {
		t.Fatalf("the zombie's stat: %d, %v; want its start %d", st, err, start)
	}
	var log eventLog
	s := lifeSession(&log)
	s.targets = map[int]uint64{pid: start}
	if s.targetAlive(pid) {
		t.Error("a zombie --pid target is taken as running")
	}
	s.lifeOf(uint32(pid)).start = start
	s.sweep()
	s.lives[uint32(pid)].gone -= uint64(pendingAfterExit)
	s.lastSweep = time.Time{}
	s.sweep()
	if _, ok := s.lives[uint32(pid)]; ok {
		t.Error("the sweep kept a zombie's life")
	}
}

// TestLifeOfAfterEnd: the life lifeOf remembers from the last call is not
// handed out once ended: the PID's next process is born anew, and another
// PID's life is its own.
func TestLifeOfAfterEnd(t *testing.T) {
	s := lifeSession(&eventLog{})
	a := s.lifeOf(gonePID)
	a.exe = "/bin/a"
	if s.lifeOf(gonePID) != a || s.lifeOf(gonePID+1) == a {
		t.Fatal("lifeOf: not the same life for one PID, or the same for two")
	}
	s.lifeOf(gonePID) // the last asked for again
	s.end(gonePID)
	if b := s.lifeOf(gonePID); b == a || b.exe != "" || s.lives[gonePID] != b {
		t.Fatalf("after its end: life %p (exe %q), the ended one %p; want a new one, in lives", b, b.exe, a)
	}
}
