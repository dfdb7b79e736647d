package gpu_test

import (
	"errors"
	"testing"

	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/gpu"
)

// TestNoCUDAIsNotACrash checks that asking for CUDA where there is none is a plain error.
func TestNoCUDAIsNotACrash(t *testing.T) {
	n, err := gpu.CUDADeviceCount()
	if err != nil && !errors.Is(err, gpu.ErrNoCUDA) {
		t.Fatalf("device count: %v does not wrap ErrNoCUDA", err)
	}
	if err != nil {
		t.Logf("no CUDA: %v", err)
		if _, err := gpu.OpenMover(kvmem.EngineHandle{Kind: kvmem.HandleCUDAIPC, IPC: make([]byte, 64), Size: 4096}, kvmem.Layout{}, gpu.CUDAMoverOptions{}); !errors.Is(err, gpu.ErrNoCUDA) {
			t.Fatalf("CUDA mover without CUDA: %v", err)
		}
		return
	}
	t.Logf("%d CUDA devices", n)
}
