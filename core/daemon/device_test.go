package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/enginesim"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool/embedded"
)

// fakeDevice stands in for a GPU, which CI lacks: it records the handles the daemon asks it to
// open and serves them from shared memory of its own.
type fakeDevice struct {
	mem *hostmem.SharedMemory
	mu  sync.Mutex
	got []kvmem.EngineHandle
}

func (f *fakeDevice) OpenMover(h kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	f.mu.Lock()
	f.got = append(f.got, h)
	f.mu.Unlock()
	return hostmem.NewMover(f.mem.FD, int64(len(f.mem.Data)), layout)
}

// TestDeviceMemoryOpener: the daemon opens CUDA memory only through the device backend it was
// given, passing the registration's handle through unchanged, and refuses it without one.
func TestDeviceMemoryOpener(t *testing.T) {
	const size = 4096
	layout := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Size: 64, Stride: 64}}}}}
	ipc := bytes.Repeat([]byte{7}, 64)
	cudaIPC := func(name string) *enginepb.RegisterRequest {
		return &enginepb.RegisterRequest{Engine: name, ModelKey: "m", Scheduler: true, Layout: layout,
			Memory: &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: ipc, Offset: 512, Size: size, Device: 2}}}
	}
	start := func(dev kvmem.DeviceOpener) *engineapi.Client {
		popts := embedded.DefaultOptions()
		popts.Segments = []embedded.SegmentSpec{{Name: "t", Capacity: 16 << 20}}
		r := daemontest.Start(t, daemon.Config{Pool: popts, Device: dev})
		c, err := engineapi.Dial(r.Info.Socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ctx := context.Background()

	_, err := start(nil).Register(ctx, cudaIPC("none"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), kvmem.ErrNoDevice.Error()) {
		t.Fatalf("CUDA IPC memory without a device backend: %v, want FailedPrecondition naming %q", err, kvmem.ErrNoDevice)
	}

	devMem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer devMem.Close()
	dev := &fakeDevice{mem: devMem}
	c := start(dev)
	if _, err := c.Register(ctx, cudaIPC("ipc")); err != nil {
		t.Fatalf("CUDA IPC memory with a device backend: %v", err)
	}
	fdMem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer fdMem.Close()
	if _, err := c.RegisterCUDAFD(ctx, &enginepb.RegisterRequest{Engine: "fd", ModelKey: "m", Layout: layout}, fdMem.FD, size, 3); err != nil {
		t.Fatalf("CUDA fd memory with a device backend: %v", err)
	}
	shm, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	if _, err := c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "shm", ModelKey: "m", Layout: layout}, shm.FD, size); err != nil {
		t.Fatalf("shared memory: %v", err)
	}

	dev.mu.Lock()
	defer dev.mu.Unlock()
	if len(dev.got) != 2 {
		t.Fatalf("device backend opened %d handles, want 2 (shared memory is not its): %+v", len(dev.got), dev.got)
	}
	if h := dev.got[0]; h.Kind != kvmem.HandleCUDAIPC || !bytes.Equal(h.IPC, ipc) || h.Offset != 512 || h.Size != size || h.Device != 2 {
		t.Errorf("CUDA IPC handle %+v", h)
	}
	if h := dev.got[1]; h.Kind != kvmem.HandleCUDAFD || h.FD < 0 || h.Size != size || h.Device != 3 {
		t.Errorf("CUDA fd handle %+v", h)
	}
}

// memfdDevice is a device backend whose "device memory" is shared host memory handed over as a
// CUDA file descriptor, so that the CUDA fd path of a simulated engine and of the daemon runs
// without a GPU.
type memfdDevice struct{ allocs, opens atomic.Int32 }

type memfdMemory struct {
	shm *hostmem.SharedMemory
	mv  kvmem.Mover
	h   kvmem.EngineHandle
}

func (m *memfdMemory) Handle() kvmem.EngineHandle { return m.h }
func (m *memfdMemory) Mover() kvmem.Mover         { return m.mv }
func (m *memfdMemory) Close() error               { return errors.Join(m.mv.Close(), m.shm.Close()) }

func (d *memfdDevice) AllocEngineMemory(device int, size uint64, layout kvmem.Layout) (kvmem.DeviceMemory, error) {
	shm, err := hostmem.NewSharedMemory(int64(size))
	if err != nil {
		return nil, err
	}
	mv, err := hostmem.NewMover(shm.FD, int64(size), layout)
	if err != nil {
		return nil, errors.Join(err, shm.Close())
	}
	d.allocs.Add(1)
	return &memfdMemory{shm: shm, mv: mv, h: kvmem.EngineHandle{Kind: kvmem.HandleCUDAFD, Device: device, FD: shm.FD, Size: size}}, nil
}

func (d *memfdDevice) OpenMover(h kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	if h.Kind != kvmem.HandleCUDAFD {
		return nil, errors.New("memfd device: only CUDA fd handles")
	}
	d.opens.Add(1)
	return hostmem.NewMover(h.FD, int64(h.Size), layout)
}

// TestSimulatedEngineOnInjectedDevice runs a two-rank simulated engine whose KV memory comes
// from the device backend in its Config, registered as CUDA fd memory with a daemon that opens
// it through the device backend in its own Config: a cold pass saves, a warm pass loads every
// full block, each checked byte for byte. Without a device backend the engine refuses the kind.
func TestSimulatedEngineOnInjectedDevice(t *testing.T) {
	dev := &memfdDevice{}
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "t", Capacity: 256 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Device: dev})
	ctx := context.Background()
	const T = 16
	cfg := enginesim.Config{Socket: r.Info.Socket, ModelKey: "dev-model", World: 2, TokensPerBlock: T, Slots: 512,
		PageBytes: []int{4096, 1024}, ReplicatedBytes: []int{0, 512}, Chunk: 4 * T, Memory: enginesim.MemoryCUDAFD}
	if _, err := enginesim.Start(ctx, cfg); !errors.Is(err, kvmem.ErrNoDevice) {
		t.Fatalf("CUDA fd engine without a device backend: %v, want ErrNoDevice", err)
	}
	cfg.Device = dev
	coldWarm(t, cfg, prompts(43, 24, T, "dev"), 8)
	if a, o := dev.allocs.Load(), dev.opens.Load(); a != 4 || o != 4 {
		t.Errorf("device backend allocated %d and opened %d rank memories, want 4 and 4", a, o)
	}
}

// coldWarm runs a cold engine over reqs (running at most running at once), then a warm one
// over the same prompts, each started from cfg under the names "cold" and "warm" and closed
// after its pass; the warm pass must load every full block without a restart.
func coldWarm(t *testing.T, cfg enginesim.Config, reqs []enginesim.Request, running int) {
	t.Helper()
	ctx := context.Background()
	var warm enginesim.Result
	for _, name := range []string{"cold", "warm"} {
		cfg.Name = name
		e, err := enginesim.Start(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		res, err := e.Run(ctx, reqs, running)
		if err != nil {
			t.Fatalf("%s pass: %v", name, err)
		}
		if err := e.Close(ctx); err != nil {
			t.Fatal(err)
		}
		warm = res
	}
	want := 0
	for _, q := range reqs {
		want += (len(q.Tokens) - 1) / cfg.TokensPerBlock
	}
	if warm.LoadedBlocks != want || warm.Restarts != 0 {
		t.Errorf("warm pass loaded %d blocks (restarts %d), want %d", warm.LoadedBlocks, warm.Restarts, want)
	}
}
