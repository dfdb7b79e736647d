package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/daemon"
	"github.com/kvctl/kvctl/core/daemon/daemontest"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool/embedded"
)

// fenceLog records, in order, what the daemon did about the engine's event and its copies.
type fenceLog struct {
	mu     sync.Mutex
	events []string
}

func (l *fenceLog) add(e string) { l.mu.Lock(); l.events = append(l.events, e); l.mu.Unlock() }

func (l *fenceLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// fencingDevice is a device backend whose movers wait for the engine's event on the device
// (kvmem.FenceWaiter), as the CUDA movers' streams do, over shared memory, since CI has no GPU
// (on the GPU the same path runs in TestGPUStreamOrdering). It logs each fence taken, each
// fence a mover waits for and each copy.
type fencingDevice struct {
	mem *hostmem.SharedMemory
	log *fenceLog
}

type loggedFence struct{ log *fenceLog }

func (f loggedFence) Wait(context.Context) error { f.log.add("host wait"); return nil }
func (loggedFence) Release()                     {}

type loggedOrder struct{ log *fenceLog }

func (o loggedOrder) Fence() (kvmem.DeviceFence, error) {
	o.log.add("fence taken")
	return loggedFence(o), nil
}
func (loggedOrder) Signal() error  { return nil }
func (loggedOrder) Handle() []byte { return bytes.Repeat([]byte{0xd6}, kvmem.EngineEventBytes) }
func (loggedOrder) Close() error   { return nil }

func (d *fencingDevice) OpenStreamOrder(_ int, h []byte) (kvmem.StreamOrder, error) {
	if err := kvmem.CheckEventHandle(h); err != nil {
		return nil, err
	}
	return loggedOrder{d.log}, nil
}

func (d *fencingDevice) OpenMover(_ kvmem.EngineHandle, layout kvmem.Layout) (kvmem.Mover, error) {
	m, err := hostmem.NewMover(d.mem.FD, int64(len(d.mem.Data)), layout)
	if err != nil {
		return nil, err
	}
	return fencingMover{Mover: m, log: d.log}, nil
}

type fencingMover struct {
	kvmem.Mover
	log *fenceLog
}

func (m fencingMover) WaitFence(f kvmem.DeviceFence) error {
	if _, ok := f.(loggedFence); !ok {
		return errors.New("a fence of another backend")
	}
	m.log.add("device wait")
	return nil
}

func (m fencingMover) Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) error {
	m.log.add("scatter")
	return m.Mover.Scatter(ctx, src, pages)
}

func (m fencingMover) Gather(ctx context.Context, pages []kvmem.PageRef, dst [][]byte) error {
	m.log.add("gather")
	return m.Mover.Gather(ctx, pages, dst)
}

func (m fencingMover) Clone() (kvmem.Mover, error) {
	c, err := m.Mover.Clone()
	if err != nil {
		return nil, err
	}
	return fencingMover{Mover: c, log: m.log}, nil
}

// upToFirst cuts events after the first occurrence of e (several copies may follow).
func upToFirst(events []string, e string) []string {
	if i := slices.Index(events, e); i >= 0 {
		return events[:i+1]
	}
	return events
}

// Seed commit 17 over `kvctl serve`: the allocation fence is the engine's CUDA interprocess
// event (RegisterRequest.engine_event). A synchronous load takes it when StartLoad is called
// and an asynchronous load when BindMeta queues it, and each load's first copy into engine
// memory is queued behind it on the daemon's copy stream: the fence is taken, the mover waits
// for it on the device (the host never waits), and only then does the first scatter run.
func TestLoadsFirstCopyWaitsOnTheEngineEvent(t *testing.T) {
	const size = 1 << 16
	mem, err := hostmem.NewSharedMemory(size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	log := &fenceLog{}
	popts := embedded.DefaultOptions()
	popts.Segments = []embedded.SegmentSpec{{Name: "t", Capacity: 16 << 20}}
	r := daemontest.Start(t, daemon.Config{Pool: popts, Device: &fencingDevice{mem: mem, log: log}})
	c, err := engineapi.Dial(r.Info.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	layout := &enginepb.Layout{TokensPerBlock: 16, Groups: []*enginepb.LayerGroup{{Slots: 16, Regions: []*enginepb.Region{{Size: 256, Stride: 256}}}}}
	register := func(name string, async bool) {
		t.Helper()
		_, err := c.Register(ctx, &enginepb.RegisterRequest{Engine: name, ModelKey: "m", Scheduler: true, Layout: layout, AsyncLoad: async,
			EngineEvent: &enginepb.CudaEvent{Handle: bytes.Repeat([]byte{0xe2}, kvmem.EngineEventBytes), Device: 0},
			Memory:      &enginepb.RegisterRequest_CudaIpc{CudaIpc: &enginepb.CudaIPC{Handle: bytes.Repeat([]byte{7}, 64), Size: size}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	register("sync", false)
	register("async", true)

	// The prompt's four whole blocks, computed into pages 0-3, go to the pool.
	toks := make([]int64, 4*16+1)
	for i := range toks {
		toks[i] = int64(500 + i)
	}
	for i := range mem.Data[:4*256] {
		mem.Data[i] = byte(i*7 + 3)
	}
	ids := func(first int) []*enginepb.BlockIDs {
		return []*enginepb.BlockIDs{{Ids: []int32{int32(first), int32(first + 1), int32(first + 2), int32(first + 3), int32(first + 4)}}}
	}
	if _, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: "sync", Request: &enginepb.Request{Id: "s", Tokens: toks}}); err != nil {
		t.Fatal(err)
	}
	meta, err := c.BuildMeta(ctx, &enginepb.BuildMetaRequest{Engine: "sync", NewRequests: []*enginepb.RequestData{{Id: "s", NewBlockIdsByGroup: ids(0), NumScheduledTokens: int32(len(toks))}}})
	if err != nil || len(meta.GetSaves()) != 1 {
		t.Fatalf("build = %v, %v", meta, err)
	}
	if _, err := c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "sync", Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForSave(ctx, &enginepb.EngineRef{Engine: "sync"}); err != nil {
		t.Fatal(err)
	}
	for fin := []string{"s"}; ; fin = nil {
		resp, err := c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: "sync", FinishedGen: fin})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(resp.GetFinishedSaving(), "s") {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the saves never finished")
		}
		time.Sleep(time.Millisecond)
	}
	if got := upToFirst(log.take(), "gather"); !slices.Equal(got, []string{"fence taken", "device wait", "gather"}) {
		t.Fatalf("save: %q, want the fence taken and waited for on the device before the first read", got)
	}

	// A synchronous load of the same prefix into pages 8-11.
	lookupAndAlloc := func(engine, id string, first int) *enginepb.Metadata {
		t.Helper()
		lk, err := c.Lookup(ctx, &enginepb.LookupRequest{Engine: engine, Request: &enginepb.Request{Id: id, Tokens: toks}})
		if err != nil || lk.GetMatchedTokens() != 64 {
			t.Fatalf("%s lookup = %v, %v; want 64 tokens offered", engine, lk, err)
		}
		if _, err := c.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: engine, RequestId: id, BlockIdsByGroup: ids(first), HonouredTokens: 64}); err != nil {
			t.Fatal(err)
		}
		sched := &enginepb.RequestData{Id: id, NewBlockIdsByGroup: ids(first), NumScheduledTokens: 1}
		if lk.GetAsync() {
			sched = nil
		}
		req := &enginepb.BuildMetaRequest{Engine: engine}
		if sched != nil {
			req.NewRequests = []*enginepb.RequestData{sched}
		}
		m, err := c.BuildMeta(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	meta = lookupAndAlloc("sync", "l", 8)
	if len(meta.GetLoads()) != 1 || len(meta.GetLoads()[0].GetPages()) != 4 {
		t.Fatalf("synchronous offer built %v", meta)
	}
	if _, err := c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "sync", Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	if got := log.take(); len(got) != 0 {
		t.Fatalf("binding a synchronous load did %q before StartLoad", got)
	}
	if _, err := c.StartLoad(ctx, &enginepb.EngineRef{Engine: "sync"}); err != nil {
		t.Fatal(err)
	}
	if got := upToFirst(log.take(), "scatter"); !slices.Equal(got, []string{"fence taken", "device wait", "scatter"}) {
		t.Fatalf("synchronous load: %q, want the fence taken and waited for on the device before the first copy", got)
	}
	if !bytes.Equal(mem.Data[8*256:12*256], mem.Data[:4*256]) {
		t.Fatal("the loaded pages differ from the saved ones")
	}

	// An asynchronous load into pages 11-14 by the other engine: the fence is taken when
	// BindMeta queues it, and the load worker waits for it before its first copy.
	meta = lookupAndAlloc("async", "p", 11)
	if len(meta.GetAsyncLoads()) != 1 || len(meta.GetAsyncLoads()[0].GetPages()) != 4 {
		t.Fatalf("asynchronous offer built %v", meta)
	}
	if _, err := c.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: "async", Metadata: meta}); err != nil {
		t.Fatal(err)
	}
	for started := []string{"p"}; ; started = nil {
		resp, err := c.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: "async", StartedLoading: started})
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(resp.GetFinishedLoading(), "p") {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the asynchronous load never finished")
		}
		time.Sleep(time.Millisecond)
	}
	if got := upToFirst(log.take(), "scatter"); !slices.Equal(got, []string{"fence taken", "device wait", "scatter"}) {
		t.Fatalf("asynchronous load: %q, want the fence taken and waited for on the device before the first copy", got)
	}
	if !bytes.Equal(mem.Data[11*256:15*256], mem.Data[:4*256]) {
		t.Fatal("the asynchronously loaded pages differ from the saved ones")
	}
}
