//go:build cgo && linux

package gpu

import (
	"errors"

	"github.com/kvctl/kvctl/core/kvmem"
)

func openCUDAMover(h EngineHandle, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.Mover, error) {
	d, err := OpenCUDA(h.Device)
	if err != nil {
		return nil, err
	}
	var mem *EngineMemory
	if h.Kind == HandleCUDAIPC {
		mem, err = d.ImportIPC(h.IPC, h.Offset, h.Size)
	} else {
		mem, err = d.ImportFD(h.FD, h.Size)
	}
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	m, err := d.NewMover(mem, layout, opts)
	// The mover holds its own reference on the memory from here on.
	if cerr := mem.Close(); err != nil {
		return nil, errors.Join(err, cerr, d.Close())
	}
	return newOwnedMover(m, d.Close), nil
}
