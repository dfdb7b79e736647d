package daemon_test

import (
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool/embedded"
)

// wakeCounts counts a device's wakes by where they came from: inside a StartLoad, or not (the
// daemon's wake once it answered BindMeta over a call channel).
type wakeCounts struct {
	mu                    sync.Mutex
	inStartLoad, outsideS int
}

// wakingMover is a device mover that can be woken (kvmem.DeviceWaker), as the CUDA mover.
type wakingMover struct {
	kvmem.Mover
	n *wakeCounts
}

func (m wakingMover) WakeDevice() error {
	inLoad := strings.Contains(string(debug.Stack()), "(*Worker).StartLoad")
	m.n.mu.Lock()
	defer m.n.mu.Unlock()
	if inLoad {
		m.n.inStartLoad++
	} else {
		m.n.outsideS++
	}
	return nil
}

// wakingDevice is memfdDevice whose movers can be woken.
type wakingDevice struct {
	memfdDevice
	n wakeCounts
}

func (d *wakingDevice) OpenMover(h kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	m, err := d.memfdDevice.OpenMover(h, layout)
	if err != nil {
		return nil, err
	}
	return wakingMover{m, &d.n}, nil
}

// TestWakeAfterBindMeta: over call channels the daemon wakes an engine's device once it has
// answered a BindMeta that binds loads, before the engine sends StartLoad; over gRPC it cannot
// act after its reply, and StartLoad wakes the device itself. Either way every warm block loads.
func TestWakeAfterBindMeta(t *testing.T) {
	for _, grpcOnly := range []bool{false, true} {
		name := "channels"
		if grpcOnly {
			name = "grpc"
		}
		t.Run(name, func(t *testing.T) {
			dev := &wakingDevice{}
			popts := embedded.DefaultOptions()
			popts.Segments = []embedded.SegmentSpec{{Name: "t", Capacity: 64 << 20}}
			r := daemontest.Start(t, daemon.Config{Pool: popts, Device: dev})
			const T = 16
			cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "wake-model", TokensPerBlock: T, Slots: 256,
				Memory: enginesim.MemoryCUDAFD, Device: &dev.memfdDevice, NoCallChannels: grpcOnly}
			coldWarm(t, cfg, prompts(47, 8, T, "wake"), 4)
			dev.n.mu.Lock()
			defer dev.n.mu.Unlock()
			switch {
			case grpcOnly && (dev.n.outsideS != 0 || dev.n.inStartLoad == 0):
				t.Errorf("over gRPC: %d wakes after BindMeta, %d in StartLoad; want none and some", dev.n.outsideS, dev.n.inStartLoad)
			case !grpcOnly && dev.n.outsideS == 0:
				t.Errorf("over call channels: no wake after BindMeta (%d in StartLoad)", dev.n.inStartLoad)
			}
		})
	}
}
