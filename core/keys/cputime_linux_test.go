package keys

import "golang.org/x/sys/unix"

// threadCPU returns the CPU time of the calling OS thread, which excludes the time the thread
// waits for a core on a busy machine. Callers lock the goroutine to its thread.
func threadCPU() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
