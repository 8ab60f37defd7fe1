// Package watchdog makes sure a process the tracer stopped is resumed, even
// when the tracer dies without resuming it.
//
// With loader.Options.Hold, BPF stops (SIGSTOP) each traced process at
// its first record until the tracer's reader has read its mappings and sends
// SIGCONT. BPF writes each such process into a map (`held`) and the reader
// deletes it as it resumes it. A tracer killed in between (SIGKILL, the OOM
// killer, a crash) would leave the job stopped for good: nothing else sends
// SIGCONT. So the tracer starts a small child of its own binary (Start) that
// holds a file descriptor of that map, and the read end of a pipe whose only
// write end the tracer holds. End of file on the pipe is the tracer's death
// (the kernel closes its descriptors however it dies) or its Close: the
// child resumes every process left in the map and exits. Meanwhile it
// resumes any process held longer than MaxHold, so that a tracer that is
// alive but not reading (stopped, starved) cannot keep a job waiting either.
package watchdog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/cudatrace/cudatrace/proc"
)

// The top bits of a held entry's stop time (bpf/common.h): Released, the
// reader has read the process and leaves it stopped only for another
// tracer that holds it too (loader.Tracer.Release); Resumed, the reader
// has sent it SIGCONT. The entry stays while the process lives: BPF holds
// it again by overwriting an entry Released, so no record gets through
// unheld right after the SIGCONT.
const (
	Released = uint64(1) << 63
	Resumed  = uint64(1) << 62
)

// MaxHold is how long a process may stay stopped for the reader before the
// watchdog resumes it anyway. The reader normally takes milliseconds.
const MaxHold = 5 * time.Second

// every is how often the child looks for processes held past MaxHold.
const every = 250 * time.Millisecond

// Child's descriptors: ExtraFiles start at 3.
const (
	fdMap  = 3
	fdPipe = 4
)

// Watchdog is the tracer's end: the child process and the pipe's write end.
type Watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File
	done chan error
}

// Start runs argv (this binary's hidden watchdog verb, whose body is Main)
// with held, the BPF map of held processes, and returns once the child
// runs. stderr gets the child's one line per process it had to resume.
func Start(argv []string, held *ebpf.Map, stderr io.Writer) (*Watchdog, error) {
	if len(argv) == 0 {
		return nil, errors.New("watchdog: no command")
	}
	// The child's own descriptor of the map: a duplicate, closed here
	// once the child has it.
	fd, err := unix.FcntlInt(uintptr(held.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("watchdog: duplicate the held map's descriptor: %w", err)
	}
	mf := os.NewFile(uintptr(fd), "held")
	defer mf.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	cmd.ExtraFiles = []*os.File{mf, r}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start watchdog: %w", err)
	}
	// A dying process's descriptors are released in the reverse order of
	// their numbers (close_files queues each release, the exit runs the
	// queue last in, first out), and releasing the probes' descriptors
	// takes a while: the write end, moved above them all, goes first.
	if hi, err := highFD(w); err == nil {
		w.Close()
		w = hi
	}
	wd := &Watchdog{cmd: cmd, pipe: w, done: make(chan error, 1)}
	go func() { wd.done <- cmd.Wait() }()
	return wd, nil
}

// Close tells the child the tracer is done: it resumes whatever is still
// held and exits. Close waits for it, a few seconds at most.
func (w *Watchdog) Close() error {
	if w == nil || w.pipe == nil {
		return nil
	}
	w.pipe.Close()
	w.pipe = nil
	select {
	case err := <-w.done:
		if err != nil {
			return fmt.Errorf("watchdog: %w", err)
		}
		return nil
	case <-time.After(5 * time.Second):
		w.cmd.Process.Kill()
		return errors.New("watchdog did not exit within 5 s: killed")
	}
}

// Main is the child's body: fd 3 is the held map, fd 4 the pipe. It
// returns when the tracer is gone, having resumed every process left held.
func Main(stderr io.Writer) error {
	// The terminal's Ctrl-C, a hangup or a polite kill of the process
	// group must not take the watchdog before the tracer: it leaves
	// when the tracer does.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	// The OOM killer's choice when memory runs out is the tracer (its
	// ring buffer, unwinding, ledger), not this: a few MiB that must
	// outlive it. Best effort (root may lower its score).
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	held, err := ebpf.NewMapFromFD(fdMap)
	if err != nil {
		return fmt.Errorf("watchdog: held map on fd %d: %w", fdMap, err)
	}
	defer held.Close()
	fds := []unix.PollFd{{Fd: fdPipe, Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, int(every/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("watchdog: poll: %w", err)
		}
		// The tracer never writes: readable or hung up is end of file.
		if fds[0].Revents != 0 {
			Resume(held, 0, stderr)
			return nil
		}
		Resume(held, MaxHold, stderr)
	}
}

// Resume sends SIGCONT to every process in held stopped longer than
// olderThan (0: all of them, the tracer is gone) and deletes their
// entries. A PID whose process started after it was stopped is another
// process: its entry goes, with no signal. An entry the reader resumed
// already goes too, signalled only with olderThan 0 and the process
// stopped (held again as the reader marked it). It returns how many
// processes it resumed.
func Resume(held *ebpf.Map, olderThan time.Duration, stderr io.Writer) int {
	now := BootNow()
	var (
		pid  uint32
		at   uint64
		due  []uint32
		when []uint64
	)
	it := held.Iterate()
	for it.Next(&pid, &at) {
		if at&Resumed != 0 {
			if olderThan == 0 {
				due = append(due, pid)
				when = append(when, at)
			}
			continue
		}
		at &^= Released
		if olderThan == 0 || now > at && time.Duration(now-at) >= olderThan {
			due = append(due, pid)
			when = append(when, at)
		}
	}
	n := 0
	for i, pid := range due {
		// Deleted first: the reader, if alive, then leaves it alone.
		if err := held.Delete(pid); err != nil {
			continue // the reader resumed it meanwhile
		}
		if when[i]&Resumed != 0 {
			if stopped, _ := proc.Stopped(int(pid)); !stopped {
				continue
			}
			when[i] &^= Released | Resumed
		}
		// /proc's start time is in clock ticks: a process started
		// within one of the stop is the same one.
		if st, err := proc.StartTime(int(pid)); err != nil || st > when[i]+uint64(proc.StartTimeTick) {
			continue
		}
		if err := unix.Kill(int(pid), unix.SIGCONT); err == nil {
			n++
			if stderr != nil {
				fmt.Fprintf(stderr, "cudatrace: resumed pid %d, stopped for the tracer %s ago\n", pid,
					time.Duration(now-when[i]).Round(time.Millisecond))
			}
		}
	}
	return n
}

// highFD duplicates f to a descriptor numbered above any the tracer opens.
func highFD(f *os.File) (*os.File, error) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return nil, err
	}
	want := min(lim.Cur/2, 1<<16)
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, int(want))
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// BootNow is CLOCK_BOOTTIME in nanoseconds: the clock BPF stamps the held
// entries and every record with (bpf_ktime_get_boot_ns); 0 if unreadable.
func BootNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}
