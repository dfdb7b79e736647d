//go:build !(cgo && linux)

package enginesim

import (
	"errors"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

func newCUDAMemory(uint64, kvmem.Layout) (*rankMemory, error) {
	return nil, errors.Join(gpu.ErrNoCUDA, gpu.ErrCUDANotBuilt)
}
