package enginesim

import (
	"fmt"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// Engine memory kinds Config.Memory selects.
const (
	// MemoryShared is a shared-memory file, handed to the daemon over the descriptor channel.
	MemoryShared = "shm"
	// MemoryCUDAFD is CUDA device memory made with cuMemCreate and exported as a file
	// descriptor, as an engine with a virtual-memory KV pool has; it needs a GPU and a cgo build.
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
	mem, err := gpu.NewSharedMemory(int64(size))
	if err != nil {
		return nil, err
	}
	mv, err := gpu.NewHostMover(mem.FD, int64(size), layout)
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

func newRankMemory(kind string, size uint64, layout kvmem.Layout) (*rankMemory, error) {
	switch kind {
	case "", MemoryShared:
		return newSharedMemory(size, layout)
	case MemoryCUDAFD:
		return newCUDAMemory(size, layout)
	}
	return nil, fmt.Errorf("unknown engine memory kind %q: want %s or %s", kind, MemoryShared, MemoryCUDAFD)
}
