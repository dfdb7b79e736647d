package kvmem

import (
	"errors"
	"fmt"
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

// EngineHandle names an engine's registered KV memory.
type EngineHandle struct {
	Kind   HandleKind `json:"kind"`
	Device int        `json:"device"`           // CUDA device ordinal
	FD     int        `json:"-"`                // shm and cuda-fd: received over the unix socket
	IPC    []byte     `json:"ipc,omitempty"`    // cuda-ipc: 64 bytes, or PyTorch's 66
	Offset uint64     `json:"offset,omitempty"` // cuda-ipc: start within the allocation
	Size   uint64     `json:"size"`
}

// OnDevice reports whether the memory h names lives on an accelerator (CUDA IPC or a CUDA file
// descriptor) rather than in host memory.
func (h EngineHandle) OnDevice() bool { return h.Kind == HandleCUDAIPC || h.Kind == HandleCUDAFD }

// ErrNoDevice is returned for device memory where no DeviceOpener or DeviceAllocator was given.
var ErrNoDevice = errors.New("no device backend for CUDA memory")

// DeviceOpener opens engine memory that lives on an accelerator as a Mover. The gpu package
// implements it; a daemon is handed one by the command that starts it, so the core never
// depends on the hardware it drives.
//
// OpenMover takes a handle whose OnDevice is true. The returned mover and its clones own what
// was opened for them (the mapping, the imported allocation, the device context); the last
// Close releases it. h.FD stays the caller's. OpenMover is safe for concurrent use.
type DeviceOpener interface {
	// OpenMover opens the device memory h names as a Mover for layout (see above).
	OpenMover(h EngineHandle, layout Layout) (Mover, error)
}

// DeviceMemory is KV memory an engine allocated for itself on a device.
type DeviceMemory interface {
	// Handle is what the engine registers the memory with; its descriptor stays the memory's.
	Handle() EngineHandle
	// Mover is a Mover over the memory for the engine's own reads and writes.
	Mover() Mover
	// Close releases the mover, the descriptor and the memory.
	Close() error
}

// DeviceAllocator allocates engine KV memory on an accelerator the way an engine's own KV pool
// does, for simulated engines. The gpu package implements it.
//
// AllocEngineMemory allocates at least size bytes on device, exported so that another process
// can import it (a HandleCUDAFD handle), and a Mover over it for layout.
type DeviceAllocator interface {
	// AllocEngineMemory allocates exportable memory on device (see above).
	AllocEngineMemory(device int, size uint64, layout Layout) (DeviceMemory, error)
}

// CheckStagingShape refuses a staging request that no Mover can satisfy: fewer than one slot
// or one byte per slot, or more than 128 TiB in all. Mover implementations call it first in
// NewStaging.
func CheckStagingShape(slots, slotBytes int) error {
	if slots < 1 || slotBytes < 1 {
		return fmt.Errorf("staging: need at least one slot of at least one byte, got %d slots of %d bytes", slots, slotBytes)
	}
	if slotBytes > (1<<47)/slots {
		return fmt.Errorf("staging: %d slots of %d bytes is too large", slots, slotBytes)
	}
	return nil
}
