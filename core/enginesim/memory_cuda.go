//go:build cgo && linux

package enginesim

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// newCUDAMemory allocates exportable device memory on GPU 0, as a virtual-memory engine pool
// would, and a CUDA mover over it for the engine's own KV writes and checks.
func newCUDAMemory(size uint64, layout kvmem.Layout) (*rankMemory, error) {
	d, err := gpu.OpenCUDA(0)
	if err != nil {
		return nil, err
	}
	mem, fd, err := d.AllocExportable(size)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	mv, err := d.NewMover(mem, layout, gpu.CUDAMoverOptions{})
	if err != nil {
		_ = unix.Close(fd)
		_ = mem.Close()
		_ = d.Close()
		return nil, fmt.Errorf("engine mover: %w", err)
	}
	return &rankMemory{fd: fd, size: mem.Size(), device: 0, mover: mv, release: func() error {
		return errors.Join(mv.Close(), unix.Close(fd), mem.Close(), d.Close())
	}}, nil
}
