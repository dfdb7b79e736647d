//go:build !linux

package keys

import "time"

// threadCPU falls back to the wall clock where thread CPU time is not read.
func threadCPU() int64 { return time.Now().UnixNano() }
