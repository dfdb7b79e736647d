//go:build linux

package stats

import (
	"time"

	"golang.org/x/sys/unix"
)

// threadCPU returns the CPU time (user + system) the calling OS thread has used. It is only
// meaningful across an interval in which the goroutine stays on one thread: callers that time
// phases hold runtime.LockOSThread for the duration.
func threadCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ThreadCPUSupported reports whether phases record per-thread CPU time on this platform.
const ThreadCPUSupported = true
