package kvmem

import (
	"context"
	"errors"
	"io"
	"time"
)

// Mover copies page values between an engine's registered memory and host buffers. A value is
// the page's regions concatenated in region order.
//
// Gather and Scatter complete before they return: on return from Gather the bytes are in dst,
// on return from Scatter the engine memory holds them. A Mover is not safe for concurrent use;
// each worker (and its stream) owns one, made with Clone.
type Mover interface {
	// Layout returns the layout the engine memory was registered with.
	Layout() Layout
	// Gather copies each page's value into dst[i], which must be exactly its size.
	Gather(ctx context.Context, pages []PageRef, dst [][]byte) error
	// Scatter copies src[i] into each page's regions; src[i] must be exactly the value size.
	Scatter(ctx context.Context, src [][]byte, pages []PageRef) error
	// NewStaging allocates host buffers suited as transfer targets for this mover (pinned memory
	// on a GPU host): slots buffers of slotBytes each.
	NewStaging(slots int, slotBytes int) (Staging, error)
	// Clone returns an independent Mover over the same engine memory for another worker.
	Clone() (Mover, error)
	// Close releases what the mover holds. Staging buffers it made must be closed first.
	Close() error
}

// Staging is a set of equal host buffers used between the pool and engine memory.
type Staging interface {
	// Slots is the number of buffers.
	Slots() int
	// SlotBytes is the size of each buffer.
	SlotBytes() int
	// Slot returns buffer i. It stays valid until Close.
	Slot(i int) []byte
	// Close releases the buffers; no slice Slot returned may be used after it.
	Close() error
}

// HostRegistrar is implemented by movers that can copy straight between engine memory and any
// host memory registered with them, not only their own staging. The connector registers an
// in-process pool's segments this way, so a load copies each page once, from the pool to the
// GPU, instead of through a staging buffer.
//
// RegisterHost registers mem (page-locked on a GPU host, which also makes every page of it
// resident) until the returned Closer is closed. Registering the same memory again, from this
// mover, a clone or another mover of the same device, is counted and costs nothing; the memory
// is unregistered when the last registration closes. mem must stay mapped until then.
type HostRegistrar interface {
	// RegisterHost registers mem until the returned Closer is closed (see above).
	RegisterHost(mem []byte) (io.Closer, error)
}

// HostPages is implemented by movers over engine memory this process maps as ordinary host
// memory (the shared-memory mover of core/hostmem). Where a page's value is one contiguous piece
// of engine memory, the pool is handed that piece: a load reads the value straight into it (a
// Mooncake cluster's Transfer Engine off the socket, the embedded pool copying and checking it
// in one pass) and a save puts the value from it, with no staging slot, gather or scatter. A
// pool that copies a value into or out of several pieces (pool.PieceCopier) is handed the
// pieces of a value split across regions (PageSegments) the same way. A page whose read fails
// may be left partly written; it is never reported loaded, as with any failed load.
type HostPages interface {
	// PageMemory returns the engine memory ref's value occupies when it is one contiguous
	// piece (Layout.ContiguousValue); ok is false otherwise. The slice is valid until the
	// mover is closed.
	PageMemory(ref PageRef) (mem []byte, ok bool)
	// PageSegments appends to out the pieces of engine memory ref's value occupies, in value
	// order (Layout.ValueSpans), and returns the list; ok is false for a reference outside the
	// layout or memory. The slices are valid until the mover is closed.
	PageSegments(ref PageRef, out [][]byte) (segs [][]byte, ok bool)
}

// PageChecker is implemented by movers that can check pages where they land in engine memory,
// on the device, instead of the host checking them before the copy (the CUDA mover, for layouts
// whose regions are multiples of 64 bytes). A load that uses it copies pages straight from pool
// memory and keeps every page whose check fails from being reported as loaded.
type PageChecker interface {
	// PageCheckError is nil when ScatterChecked works for this mover, otherwise the reason.
	PageCheckError() error
	// ScatterChecked is Scatter followed by the check. It returns once the copies are done and
	// the check is under way; wait returns its result: bad[i] is true where page i's checksum
	// (core/keys.PageChecksum) in engine memory differs from sums[i], and that
	// slot's bytes must not be used. Checks overlap the next call's copies; a result is kept
	// until wait asks for it.
	ScatterChecked(ctx context.Context, src [][]byte, pages []PageRef, sums []uint64) (wait func() (bad []bool, err error), err error)
}

// AsyncPageChecker is a PageChecker that can also return as soon as a checked scatter's copies
// are queued, so the caller prepares its next batch while the device copies this one and the
// next batch's copies queue right behind it.
type AsyncPageChecker interface {
	PageChecker
	// IssueChecked is ScatterChecked returning once the copies and the check are queued rather
	// than once the copies are done. src must stay mapped and unchanged until wait returns;
	// wait waits for the copies and the check and returns the check's result. Batches queued
	// this way may be copied in any order, so they must not write the same pages.
	IssueChecked(ctx context.Context, src [][]byte, pages []PageRef, sums []uint64) (wait func() (bad []bool, err error), err error)
}

// GPUTime is the device's own time on checked scatters, measured with events on its streams.
type GPUTime struct {
	// Copy runs from a checked scatter's first copy to its last copy done.
	Copy time.Duration
	// Check runs from then to the check's digests being back in host memory: the part of the
	// check no copy overlaps.
	Check time.Duration
}

// GPUTimer is implemented by page checkers that time their checked scatters on the device, so
// a load can tell the device's time from the host's.
type GPUTimer interface {
	// GPUTime returns the totals over every checked scatter whose check has been read.
	GPUTime() GPUTime
}

// DeviceWaker is implemented by movers whose device pays a start-up cost on the first work
// after another process used it or after an idle spell (on a GPU: switching from another
// process's context to this one, and the driver's first calls). A load calls WakeDevice as it
// begins, before it looks its pages up, so the device pays that cost while the host prepares the
// batch instead of after the first copy is issued.
type DeviceWaker interface {
	// WakeDevice queues a trivial piece of work on the device and returns without waiting for
	// it. It changes no memory a transfer uses; an error only means the device was not woken.
	// Unlike the Mover's other methods it may be called from another goroutine than the
	// mover's user, at the same time as them, Close included.
	WakeDevice() error
}

// ErrClosed is returned by a Mover used after Close.
var ErrClosed = errors.New("mover is closed")
