//go:build !linux

package stats

import "time"

// threadCPU is unavailable off Linux: phases then record wall time only and CPU seconds stay 0.
func threadCPU() time.Duration { return 0 }

// ThreadCPUSupported reports whether phases record per-thread CPU time on this platform.
const ThreadCPUSupported = false
