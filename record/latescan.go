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
	out   chan lateLib
	done  chan struct{}
	stop  context.CancelFunc
	again chan struct{} // reset: report every file again
}

// startScanner scans the processes pids returns every every. known are the
// files already probed.
func startScanner(pids func() []uint32, every time.Duration, known []loader.Library) *scanner {
	ctx, stop := context.WithCancel(context.Background())
	sc := &scanner{out: make(chan lateLib, 16), done: make(chan struct{}), stop: stop, again: make(chan struct{}, 1)}
	var seen loader.Libraries
	forget := func() {
		seen = loader.Libraries{}
		for _, l := range known {
			seen.Add(l.Path) //nolint:errcheck // one gone is not seen
		}
	}
	forget()
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
			select {
			case <-sc.again:
				forget()
			default:
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

// reset has the scan report every file again, from its next round: the
// reader forgot some (probed.go), which a process may map anew, and
// takes again (attachLib) those it knows.
func (sc *scanner) reset() {
	if sc == nil {
		return
	}
	select {
	case sc.again <- struct{}{}:
	default: // one is pending
	}
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
