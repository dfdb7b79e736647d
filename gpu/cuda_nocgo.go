//go:build !(cgo && linux)

package gpu

import (
	"errors"

	"github.com/kvctl/kvctl/core/kvmem"
)

// ErrNoCUDA is wrapped by every CUDA error; in this build CUDA is never available.
var ErrNoCUDA = errors.New("no CUDA")

// CUDAMoverOptions tune a CUDA mover; this build has none.
type CUDAMoverOptions struct {
	Streams     int
	PerCopy     bool
	BounceBytes int
}

// CUDADeviceCount reports that this build has no CUDA support.
func CUDADeviceCount() (int, error) { return 0, errors.Join(ErrNoCUDA, ErrCUDANotBuilt) }

func openCUDAMover(kvmem.EngineHandle, kvmem.Layout, CUDAMoverOptions) (kvmem.Mover, error) {
	return nil, errors.Join(ErrNoCUDA, ErrCUDANotBuilt)
}

func allocEngineMemory(int, uint64, kvmem.Layout, CUDAMoverOptions) (kvmem.DeviceMemory, error) {
	return nil, errors.Join(ErrNoCUDA, ErrCUDANotBuilt)
}

// OpenStreamOrder implements kvmem.EventOpener; this build has no CUDA.
func (c CUDA) OpenStreamOrder(int, []byte) (kvmem.StreamOrder, error) {
	return nil, errors.Join(ErrNoCUDA, ErrCUDANotBuilt)
}
