package enginesim

import (
	"fmt"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
)

// Engine memory kinds Config.Memory selects.
const (
	// MemoryShared is a shared-memory file, handed to the daemon over the descriptor channel.
	MemoryShared = "shm"
	// MemoryCUDAFD is CUDA device memory made with cuMemCreate and exported as a file
	// descriptor, as an engine with a virtual-memory KV pool has; it needs a GPU, a cgo build
	// and Config.Device.
	MemoryCUDAFD = "cuda-fd"
)

// rankMemory is one rank's KV memory: the descriptor the daemon imports, its size, a mover the
// engine itself writes and checks KV through, and what releases it all.
type rankMemory struct {
	fd      int
	size    uint64
	device  int32
	mover   kvmem.Mover
	release func() error
}

func newSharedMemory(size uint64, layout kvmem.Layout) (*rankMemory, error) {
	mem, err := hostmem.NewSharedMemory(int64(size))
	if err != nil {
		return nil, err
	}
	mv, err := hostmem.NewMover(mem.FD, int64(size), layout)
	if err != nil {
		_ = mem.Close()
		return nil, err
	}
	return &rankMemory{fd: mem.FD, size: size, mover: mv, release: func() error {
		err := mv.Close()
		if cerr := mem.Close(); err == nil {
			err = cerr
		}
		return err
	}}, nil
}

// newDeviceMemory allocates exportable device memory on GPU 0 from dev, as a virtual-memory
// engine pool would, with a mover over it for the engine's own KV writes and checks.
func newDeviceMemory(dev kvmem.DeviceAllocator, size uint64, layout kvmem.Layout) (*rankMemory, error) {
	if dev == nil {
		return nil, fmt.Errorf("engine memory %s: %w", MemoryCUDAFD, kvmem.ErrNoDevice)
	}
	mem, err := dev.AllocEngineMemory(0, size, layout)
	if err != nil {
		return nil, err
	}
	h := mem.Handle()
	return &rankMemory{fd: h.FD, size: h.Size, device: int32(h.Device), mover: mem.Mover(), release: mem.Close}, nil
}

func newRankMemory(kind string, dev kvmem.DeviceAllocator, size uint64, layout kvmem.Layout) (*rankMemory, error) {
	switch kind {
	case "", MemoryShared:
		return newSharedMemory(size, layout)
	case MemoryCUDAFD:
		return newDeviceMemory(dev, size, layout)
	}
	return nil, fmt.Errorf("unknown engine memory kind %q: want %s or %s", kind, MemoryShared, MemoryCUDAFD)
}
