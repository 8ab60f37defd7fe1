package proc

import "syscall"

// Reading /proc/PID/* of a process that has just exited fails with ESRCH.
var errESRCH error = syscall.ESRCH
