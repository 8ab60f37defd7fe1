package loader

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// readerNice is the nice value the reader's thread runs at where the
// kernel allows it (CAP_SYS_NICE, or an RLIMIT_NICE that reaches it). On
// a node whose CPUs the job's threads keep busy, the reader, one thread at
// the job's priority among many, got too little of them to keep up:
// bench/burst.sh (8 threads of the job beside 6 busy loops on 2 CPUs, 250,000
// events a second) lost 773,277 of 10M events with a 64 MiB ring in one
// run, none in others. At -10 (the scheduler's weight 9,548 against a busy
// thread's 1,024) it is served before them while it has records to read,
// and sleeps once it has caught up: it takes no more CPU than at 0, only
// sooner, at ~1.2 µs of a CPU a record.
const readerNice = -10

// raiseReader locks the calling goroutine to its thread and asks the
// kernel to run that thread at readerNice. restore puts the thread's nice
// value back and unlocks it (the thread then serves other goroutines);
// raised says whether the kernel allowed it.
func raiseReader() (restore func(), raised bool) {
	runtime.LockOSThread()
	tid := unix.Gettid()
	// getpriority(2)'s raw value is 20 - nice (1 to 40).
	raw, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return runtime.UnlockOSThread, false
	}
	old := 20 - raw
	if old <= readerNice || unix.Setpriority(unix.PRIO_PROCESS, tid, readerNice) != nil {
		return runtime.UnlockOSThread, old <= readerNice
	}
	return func() {
		if unix.Setpriority(unix.PRIO_PROCESS, tid, old) != nil {
			// Left raised: keep the thread to this goroutine, which
			// ends with it (Go then ends the thread).
			return
		}
		runtime.UnlockOSThread()
	}, true
}
