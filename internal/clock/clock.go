// Package clock reads the two clocks a trace needs tied together: the
// boot clock every record is stamped with (CLOCK_BOOTTIME, what BPF's
// bpf_ktime_get_boot_ns reads) and the wall clock, which is the only one
// two machines share. Traces from several nodes are put on one timeline
// through the pair each recorded at its start (cudatrace merge), so the
// pair says how closely its two readings were taken, and the wall clock
// how well it was synchronized then.
package clock

import (
	"time"

	"golang.org/x/sys/unix"
)

// Boot reads CLOCK_BOOTTIME in ns; 0 if it cannot be read.
func Boot() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// Pair reads the wall clock between two readings of the boot clock and
// returns it with the boot clock's midpoint, and how far apart the two
// boot readings were (the pair is good to half of that). The narrowest of
// a few tries is kept: a preemption between the reads widens one.
func Pair() (wall time.Time, boot, width uint64) {
	width = ^uint64(0)
	for range 5 {
		b1 := Boot()
		w := time.Now()
		b2 := Boot()
		if b2 >= b1 && b2-b1 < width {
			wall, boot, width = w, b1+(b2-b1)/2, b2-b1
		}
	}
	return wall, boot, width
}

// Sync is the wall clock's synchronization, as adjtimex(2) reports it.
type Sync struct {
	// Synced: a daemon (NTP, PTP) disciplines the clock: the kernel's
	// STA_UNSYNC status bit is clear.
	Synced bool
	// EstError, MaxError: the estimated and maximum error of the wall
	// clock the daemon last gave the kernel.
	EstError, MaxError time.Duration
}

// ReadSync asks the kernel how well the wall clock is synchronized (a
// read-only adjtimex, which needs no privilege); ok false when it cannot.
func ReadSync() (s Sync, ok bool) {
	var tx unix.Timex // Modes 0: read only
	state, err := unix.Adjtimex(&tx)
	if err != nil {
		return Sync{}, false
	}
	s.Synced = tx.Status&unix.STA_UNSYNC == 0 && state != unix.TIME_ERROR
	s.EstError = time.Duration(tx.Esterror) * time.Microsecond
	s.MaxError = time.Duration(tx.Maxerror) * time.Microsecond
	return s, true
}
