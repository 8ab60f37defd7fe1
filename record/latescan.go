package record

import (
	"context"
	"os"
	"time"

	"github.com/cudatrace/cudatrace/loader"
	"github.com/cudatrace/cudatrace/proc"
)

// lateScanEvery is how often the traced processes' mappings are searched
// for CUDA libraries loaded after tracing began (dlopen from a wheel).
// With --all every process on the host is searched, less often.
const (
	lateScanEvery    = 500 * time.Millisecond
	lateScanAllEvery = 2 * time.Second
)

// lateLib is a CUDA library file a process maps that no probe covers yet.
type lateLib struct {
	pid  uint32
	path string
}

// scanner searches processes' mappings for CUDA libraries loaded after
// tracing began (a wheel dlopen'ed from a virtualenv, a container's copy)
// on a goroutine of its own: with --all it reads every process's maps,
// which on a busy node takes longer than the reader goroutine may stop
// draining the ring buffer. It reports each file (inode) once; the reader
// attaches it (session.attachLate).
type scanner struct {
	out  chan lateLib
	done chan struct{}
	stop context.CancelFunc
}

// startScanner scans the processes pids returns every every. known are the
// files already probed.
func startScanner(pids func() []uint32, every time.Duration, known []loader.Library) *scanner {
	ctx, stop := context.WithCancel(context.Background())
	sc := &scanner{out: make(chan lateLib, 16), done: make(chan struct{}), stop: stop}
	var seen loader.Libraries
	for _, l := range known {
		seen.Add(l.Path)
	}
	go func() {
		defer close(sc.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		self := uint32(os.Getpid())
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, pid := range pids() {
				if pid == self {
					continue
				}
				paths, err := loader.FromProcess(int(pid))
				if err != nil {
					continue // exited
				}
				for _, path := range paths {
					if isNew, err := seen.Add(path); err != nil || !isNew {
						continue
					}
					select {
					case sc.out <- lateLib{pid, path}:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return sc
}

// close stops the scan and waits for it.
func (sc *scanner) close() {
	sc.stop()
	<-sc.done
}

// allPIDs lists every process on the host, for --all; none when /proc
// cannot be read (the start-up search found what it could).
func allPIDs() []uint32 {
	all, _ := proc.PIDs()
	out := make([]uint32, len(all))
	for i, pid := range all {
		out[i] = uint32(pid)
	}
	return out
}

// attachLate attaches what the scanner found since the last tick.
func (s *session) attachLate() {
	if s.scanner == nil {
		return
	}
	for {
		select {
		case f := <-s.scanner.out:
			s.attachLib(f.pid, f.path, 0)
		default:
			return
		}
	}
}
