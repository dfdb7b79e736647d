//go:build cgo && linux

package gpu

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/core/kvmem"
)

func openCUDAMover(h kvmem.EngineHandle, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.Mover, error) {
	d, err := OpenCUDA(h.Device)
	if err != nil {
		return nil, err
	}
	var mem *EngineMemory
	if h.Kind == kvmem.HandleCUDAIPC {
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

// exportedMemory is device memory allocated by allocEngineMemory, with its exported descriptor
// and a mover over it.
type exportedMemory struct {
	h  kvmem.EngineHandle
	mv kvmem.Mover
	// release closes the mover, the descriptor, the memory and the device, once.
	release func() error
	closed  bool
}

func (m *exportedMemory) Handle() kvmem.EngineHandle { return m.h }
func (m *exportedMemory) Mover() kvmem.Mover         { return m.mv }

func (m *exportedMemory) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	return m.release()
}

func allocEngineMemory(device int, size uint64, layout kvmem.Layout, opts CUDAMoverOptions) (kvmem.DeviceMemory, error) {
	d, err := OpenCUDA(device)
	if err != nil {
		return nil, err
	}
	mem, fd, err := d.AllocExportable(size)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	mv, err := d.NewMover(mem, layout, opts)
	if err != nil {
		_ = unix.Close(fd)
		_ = mem.Close()
		_ = d.Close()
		return nil, fmt.Errorf("engine mover: %w", err)
	}
	h := kvmem.EngineHandle{Kind: kvmem.HandleCUDAFD, Device: device, FD: fd, Size: mem.Size()}
	return &exportedMemory{h: h, mv: mv, release: func() error {
		return errors.Join(mv.Close(), unix.Close(fd), mem.Close(), d.Close())
	}}, nil
}
