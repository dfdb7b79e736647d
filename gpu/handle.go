package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/kvctl/kvctl/core/kvmem"
)

// ErrCUDANotBuilt is returned for CUDA handles by a build without cgo.
var ErrCUDANotBuilt = errors.New("CUDA support not built (needs cgo on Linux)")

// OpenMover returns a CUDA Mover over the device memory h names (a CUDA IPC handle or an
// exported file descriptor). The mover and its clones own what was opened for it (the
// imported allocation, the device context); the last Close releases it. h.FD stays the
// caller's. Shared host memory is not this package's: core/hostmem opens it.
func OpenMover(h kvmem.EngineHandle, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.Mover, error) {
	switch h.Kind {
	case kvmem.HandleCUDAIPC, kvmem.HandleCUDAFD:
		return openCUDAMover(h, layout, opts)
	case kvmem.HandleSharedMemory:
		return nil, fmt.Errorf("engine memory kind %q is host memory, not device memory", h.Kind)
	default:
		return nil, fmt.Errorf("unknown engine memory kind %q", h.Kind)
	}
}

// CUDA is this package's device backend for the core: a kvmem.DeviceOpener whose movers use
// Options, and a kvmem.DeviceAllocator. The zero value uses the default mover options. Its
// methods are safe for concurrent use.
type CUDA struct {
	// Options tune every mover OpenMover and AllocEngineMemory make.
	Options CUDAMoverOptions
}

// OpenMover implements kvmem.DeviceOpener through OpenMover.
func (c CUDA) OpenMover(h kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	return OpenMover(h, layout, c.Options)
}

// AllocEngineMemory implements kvmem.DeviceAllocator: exportable memory on device, made with
// cuMemCreate and exported as a file descriptor, as an engine with a virtual-memory KV pool
// has, with a CUDA mover over it.
func (c CUDA) AllocEngineMemory(device int, size uint64, layout kvmem.Layout) (kvmem.DeviceMemory, error) {
	return allocEngineMemory(device, size, layout, c.Options)
}

var (
	_ kvmem.DeviceOpener    = CUDA{}
	_ kvmem.DeviceAllocator = CUDA{}
)

// ownedMover closes what OpenMover opened once it and all its clones are closed.
type ownedMover struct {
	kvmem.Mover
	refs    *atomic.Int32
	release func() error
	closed  bool
}

func newOwnedMover(m kvmem.Mover, release func() error) *ownedMover {
	refs := new(atomic.Int32)
	refs.Store(1)
	return &ownedMover{Mover: m, refs: refs, release: release}
}

func (o *ownedMover) Clone() (kvmem.Mover, error) {
	c, err := o.Mover.Clone()
	if err != nil {
		return nil, err
	}
	o.refs.Add(1)
	return &ownedMover{Mover: c, refs: o.refs, release: o.release}, nil
}

func (o *ownedMover) Close() error {
	if o.closed {
		return nil
	}
	o.closed = true
	err := o.Mover.Close()
	if o.refs.Add(-1) == 0 {
		err = errors.Join(err, o.release())
	}
	return err
}

// RegisterHost passes the wrapped mover's HostRegistrar through, so an engine's mover opened
// from a handle copies straight from registered pool memory as a mover made directly does.
func (o *ownedMover) RegisterHost(mem []byte) (io.Closer, error) {
	r, ok := o.Mover.(kvmem.HostRegistrar)
	if !ok {
		return nil, errors.New("the mover cannot register host memory")
	}
	return r.RegisterHost(mem)
}

// PageCheckError passes the wrapped mover's PageChecker through.
func (o *ownedMover) PageCheckError() error {
	pc, ok := o.Mover.(kvmem.PageChecker)
	if !ok {
		return fmt.Errorf("%w: the mover does not check pages", errNotCheckable)
	}
	return pc.PageCheckError()
}

// ScatterChecked passes the wrapped mover's PageChecker through.
func (o *ownedMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	pc, ok := o.Mover.(kvmem.PageChecker)
	if !ok {
		return nil, fmt.Errorf("%w: the mover does not check pages", errNotCheckable)
	}
	return pc.ScatterChecked(ctx, src, pages, sums)
}

// IssueChecked passes the wrapped mover's AsyncPageChecker through.
func (o *ownedMover) IssueChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, sums []uint64) (func() ([]bool, error), error) {
	pc, ok := o.Mover.(kvmem.AsyncPageChecker)
	if !ok {
		return nil, fmt.Errorf("%w: the mover does not check pages", errNotCheckable)
	}
	return pc.IssueChecked(ctx, src, pages, sums)
}

// GPUTime passes the wrapped mover's GPUTimer through (zero when it has none).
func (o *ownedMover) GPUTime() kvmem.GPUTime {
	if t, ok := o.Mover.(kvmem.GPUTimer); ok {
		return t.GPUTime()
	}
	return kvmem.GPUTime{}
}

// WakeDevice passes the wrapped mover's DeviceWaker through (nothing to do when it has none).
func (o *ownedMover) WakeDevice() error {
	if w, ok := o.Mover.(kvmem.DeviceWaker); ok {
		return w.WakeDevice()
	}
	return nil
}

var (
	_ kvmem.DeviceWaker      = (*ownedMover)(nil)
	_ kvmem.HostRegistrar    = (*ownedMover)(nil)
	_ kvmem.AsyncPageChecker = (*ownedMover)(nil)
	_ kvmem.GPUTimer         = (*ownedMover)(nil)
)
