package daemon_test

import (
	"bytes"
	"context"
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
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool/embedded"
)

// orderDevice is fakeDevice with interprocess events, which CI lacks: it records the event
// handles it opens and counts what the daemon does with them.
type orderDevice struct {
	fakeDevice
	mu     sync.Mutex
	events [][]byte
	orders []*fakeOrder
}

func (d *orderDevice) OpenStreamOrder(device int, h []byte) (kvmem.StreamOrder, error) {
	if err := kvmem.CheckEventHandle(h); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	o := &fakeOrder{device: device}
	d.events = append(d.events, bytes.Clone(h))
	d.orders = append(d.orders, o)
	return o, nil
}

type fakeOrder struct {
	device  int
	signals atomic.Int32
	closed  atomic.Bool
}

type passedFence struct{}

func (passedFence) Wait(context.Context) error { return nil }
func (passedFence) Release()                   {}

func (o *fakeOrder) Fence() (kvmem.DeviceFence, error) { return passedFence{}, nil }
func (o *fakeOrder) Signal() error                     { o.signals.Add(1); return nil }
func (o *fakeOrder) Handle() []byte                    { return bytes.Repeat([]byte{0xd5}, kvmem.EngineEventBytes) }
func (o *fakeOrder) Close() error                      { o.closed.Store(true); return nil }

// TestEngineEventRegistration: an engine event is checked before any device work (only with
// CUDA memory on the same device, exactly 64 bytes), refused by a device backend that cannot
// open events, and otherwise opened: the daemon's own event comes back in the response, is
// recorded after every StartLoad and released with the engine. Shared-memory engines, which
// the host orders, get no daemon event.
func TestEngineEventRegistration(t *testing.T) {
	const size = 4096
	layout := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 8, Regions: []*enginepb.Region{{Size: 64, Stride: 64}}}}}
	event := bytes.Repeat([]byte{0xe1}, 64)
	ipc := func(name string, ev *enginepb.CudaEvent) *enginepb.RegisterRequest {
		return &enginepb.RegisterRequest{Engine: name, ModelKey: "m", Scheduler: true, Layout: layout, EngineEvent: ev,
			Memory: &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: bytes.Repeat([]byte{7}, 64), Size: size, Device: 1}}}
	}
	devMem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer devMem.Close()
	startWith := func(dev kvmem.DeviceOpener) *engineapi.Client {
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
	dev := &orderDevice{fakeDevice: fakeDevice{mem: devMem}}
	c := startWith(dev)

	shm, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer shm.Close()
	bad := []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"wrong size", func() error {
			_, err := c.Register(ctx, ipc("short", &enginepb.CudaEvent{Handle: event[:63], Device: 1}))
			return err
		}, codes.InvalidArgument, "handle is 63 bytes, a CUDA interprocess event handle (cudaIpcEventHandle_t) is 64"},
		{"66 bytes, as a PyTorch memory handle", func() error {
			_, err := c.Register(ctx, ipc("long", &enginepb.CudaEvent{Handle: append(bytes.Clone(event), 0, 0), Device: 1}))
			return err
		}, codes.InvalidArgument, "handle is 66 bytes"},
		{"another device", func() error {
			_, err := c.Register(ctx, ipc("elsewhere", &enginepb.CudaEvent{Handle: event, Device: 0}))
			return err
		}, codes.InvalidArgument, "the event is on device 0 but the engine memory on device 1"},
		{"shared memory", func() error {
			_, err := c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "shm-ev", ModelKey: "m", Layout: layout,
				EngineEvent: &enginepb.CudaEvent{Handle: event}}, shm.FD, size)
			return err
		}, codes.InvalidArgument, "shared-memory engines are ordered by the host"},
		{"no memory", func() error {
			_, err := c.Register(ctx, &enginepb.RegisterRequest{Engine: "cap", ModelKey: "m", Role: "capacity", Layout: layout,
				EngineEvent: &enginepb.CudaEvent{Handle: event}})
			return err
		}, codes.InvalidArgument, "needs engine memory on a CUDA device"},
	}
	for _, b := range bad {
		err := b.call()
		if status.Code(err) != b.code || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: %v, want %v containing %q", b.name, err, b.code, b.want)
		}
	}
	dev.mu.Lock()
	if len(dev.events) != 0 || len(dev.got) != 0 {
		t.Errorf("refused registrations reached the device: %d events, %d memories", len(dev.events), len(dev.got))
	}
	dev.mu.Unlock()

	// A device backend without events refuses an event rather than dropping it.
	_, err = startWith(&fakeDevice{mem: devMem}).Register(ctx, ipc("noevents", &enginepb.CudaEvent{Handle: event, Device: 1}))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cannot open CUDA interprocess events") {
		t.Errorf("device backend without events: %v", err)
	}

	resp, err := c.Register(ctx, ipc("ordered", &enginepb.CudaEvent{Handle: event, Device: 1}))
	if err != nil {
		t.Fatal(err)
	}
	if de := resp.GetDaemonEvent(); de == nil || !bytes.Equal(de.GetHandle(), bytes.Repeat([]byte{0xd5}, 64)) || de.GetDevice() != 1 {
		t.Fatalf("daemon event %v", resp.GetDaemonEvent())
	}
	dev.mu.Lock()
	order := dev.orders[0]
	if len(dev.events) != 1 || !bytes.Equal(dev.events[0], event) || order.device != 1 {
		t.Fatalf("device opened %d events (%x on device %d)", len(dev.events), dev.events, order.device)
	}
	dev.mu.Unlock()
	for range 2 {
		if _, err := c.StartLoad(ctx, &enginepb.EngineRef{Engine: "ordered"}); err != nil {
			t.Fatal(err)
		}
	}
	if n := order.signals.Load(); n != 2 {
		t.Fatalf("daemon event recorded %d times after 2 StartLoads", n)
	}
	if _, err := c.Unregister(ctx, &enginepb.EngineRef{Engine: "ordered"}); err != nil {
		t.Fatal(err)
	}
	if !order.closed.Load() {
		t.Fatal("the engine's events outlived its registration")
	}

	resp, err = c.RegisterSharedMemory(ctx, &enginepb.RegisterRequest{Engine: "host-ordered", ModelKey: "m", Layout: layout}, shm.FD, size)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDaemonEvent() != nil {
		t.Fatalf("a shared-memory engine got a daemon event: %v", resp.GetDaemonEvent())
	}
}
