package gpu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"

	"github.com/kvctl/kvctl/core/kvmem"
)

// HandleKind says how an engine hands its KV memory to kvctl.
type HandleKind string

const (
	// HandleSharedMemory is a shared-memory file descriptor (machines without a GPU).
	HandleSharedMemory HandleKind = "shm"
	// HandleCUDAIPC is a legacy CUDA IPC memory handle plus an offset into its allocation.
	HandleCUDAIPC HandleKind = "cuda-ipc"
	// HandleCUDAFD is a virtual-memory allocation exported as a POSIX file descriptor.
	HandleCUDAFD HandleKind = "cuda-fd"
)

// ErrCUDANotBuilt is returned for CUDA handles by a build without cgo.
var ErrCUDANotBuilt = errors.New("CUDA support not built (needs cgo on Linux)")

// EngineHandle names an engine's registered KV memory.
type EngineHandle struct {
	Kind   HandleKind `json:"kind"`
	Device int        `json:"device"`           // CUDA device ordinal
	FD     int        `json:"-"`                // shm and cuda-fd: received over the unix socket
	IPC    []byte     `json:"ipc,omitempty"`    // cuda-ipc: 64 bytes, or PyTorch's 66
	Offset uint64     `json:"offset,omitempty"` // cuda-ipc: start within the allocation
	Size   uint64     `json:"size"`
}

// OpenMover returns a Mover over the memory h names, with the backend its kind calls for. The
// mover and its clones own what was opened for it (the mapping, the imported allocation, the
// device context); the last Close releases it. h.FD stays the caller's.
func OpenMover(h EngineHandle, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.Mover, error) {
	switch h.Kind {
	case HandleSharedMemory:
		if h.Size > 1<<62 {
			return nil, fmt.Errorf("engine memory of %d bytes", h.Size)
		}
		return NewHostMover(h.FD, int64(h.Size), layout)
	case HandleCUDAIPC, HandleCUDAFD:
		return openCUDAMover(h, layout, opts)
	default:
		return nil, fmt.Errorf("unknown engine memory kind %q", h.Kind)
	}
}

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

var (
	_ kvmem.HostRegistrar = (*ownedMover)(nil)
	_ kvmem.PageChecker   = (*ownedMover)(nil)
)
