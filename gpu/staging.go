package gpu

import "sync/atomic"

// liveStaging counts the page-locked host allocations of every CUDA mover in the process that
// are not released yet.
var liveStaging atomic.Int64

// PinnedAllocations returns how many page-locked host allocations made by this package are
// still live: pinned or registered buffers of the CUDA backend, its internal bounce buffers
// included. Tests use it to check that Close releases everything.
func PinnedAllocations() int { return int(liveStaging.Load()) }
