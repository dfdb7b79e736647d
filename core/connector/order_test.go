package connector

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
)

// orderLog records, in order, what a worker did about fences and copies.
type orderLog struct {
	mu     sync.Mutex
	events []string
}

func (l *orderLog) add(e string) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *orderLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// hostFence is a fence the host waits for (a fence of host memory).
type hostFence struct {
	log *orderLog
	err error
}

func (f hostFence) Wait(context.Context) error { f.log.add("host wait"); return f.err }

// deviceFence is a kvmem.DeviceFence: what a device backend's StreamOrder.Fence returns.
type deviceFence struct {
	hostFence
	released *bool
}

func (f deviceFence) Release() { *f.released = true; f.log.add("release") }

// orderMover is a mover whose device can wait for fences (kvmem.FenceWaiter), as the CUDA
// mover's streams do; its clones share the log.
type orderMover struct {
	*hostMover
	log *orderLog
}

func (m orderMover) WaitFence(f kvmem.DeviceFence) error {
	if _, ok := f.(deviceFence); !ok {
		return errors.New("a fence of another backend")
	}
	m.log.add("device wait")
	return nil
}

func (m orderMover) Scatter(ctx context.Context, src [][]byte, pages []kvmem.PageRef) error {
	m.log.add("scatter")
	return m.hostMover.Scatter(ctx, src, pages)
}

func (m orderMover) Gather(ctx context.Context, pages []kvmem.PageRef, dst [][]byte) error {
	m.log.add("gather")
	return m.hostMover.Gather(ctx, pages, dst)
}

func (m orderMover) Clone() (kvmem.Mover, error) { return m, nil }

// plainMover hides orderMover's FenceWaiter: a mover that cannot wait on the device.
type plainMover struct{ kvmem.Mover }

func (m plainMover) Clone() (kvmem.Mover, error) {
	c, err := m.Mover.Clone()
	return plainMover{c}, err
}

// TestLoadsAndSavesPassTheEngineFence: a synchronous load takes the engine's fence when
// StartLoad is called (the allocation fence) and passes it before its first copy; a save passes
// the fence WaitForSave took before its first read. A device fence goes to a mover that can wait
// on the device (the host never waits); with a mover that cannot, or a host fence, the host
// waits. A fence that fails fails the load.
func TestLoadsAndSavesPassTheEngineFence(t *testing.T) {
	pool := newMemPool()
	opts := baseOptions()
	tokens := prompt(47, 0, 29)
	hashes := fillBlocks(t, pool, opts, tokens, 64)
	load := RequestTransfers{RequestID: "a"}
	for i, h := range hashes {
		for g := range 2 {
			load.Pages = append(load.Pages, PageTransfer{Hash: keys.PageHashOf(h), Group: g, Page: 30 + i})
		}
	}
	meta := Metadata{Loads: []RequestTransfers{load}}

	cases := []struct {
		name     string
		device   bool // the fence is a kvmem.DeviceFence
		waiter   bool // the mover is a kvmem.FenceWaiter
		fenceErr error
		want     []string
	}{
		{"device fence, device mover", true, true, nil, []string{"device wait", "scatter"}},
		{"device fence, host mover", true, false, nil, []string{"host wait", "scatter"}},
		{"host fence, device mover", false, true, nil, []string{"host wait", "scatter"}},
		{"failing host fence", false, false, errors.New("engine device lost"), []string{"host wait"}},
	}
	for ci, c := range cases {
		// Each case saves a page of its own, so none finds its key already in the pool.
		saves := Metadata{Saves: []RequestTransfers{{RequestID: "s", Pages: []PageTransfer{{Hash: keys.PageHashOf(keys.Hash{byte(ci + 1)}), Group: 0, Page: 20}}}}}
		t.Run(c.name, func(t *testing.T) {
			log := &orderLog{}
			released := false
			taken := 0
			o := opts
			o.Fence = func() Fence {
				taken++
				log.add("fence taken")
				if c.device {
					return deviceFence{hostFence: hostFence{log: log, err: c.fenceErr}, released: &released}
				}
				return hostFence{log: log, err: c.fenceErr}
			}
			var mv kvmem.Mover = orderMover{hostMover: newHostMover(testLayout(64)), log: log}
			if !c.waiter {
				mv = plainMover{mv}
			}
			w, err := NewWorker(o, pool, mv)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close(context.Background())
			if err := w.RegisterLayout(testLayout(64)); err != nil {
				t.Fatal(err)
			}
			w.BindMeta(meta)
			err = w.StartLoad(context.Background())
			if c.fenceErr != nil {
				if err == nil || !strings.Contains(err.Error(), "allocation fence: engine device lost") {
					t.Fatalf("StartLoad with a failing fence = %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			got := log.take()
			// Several scatters may follow; the order up to the first is the contract.
			if i := slices.Index(got, "scatter"); i >= 0 {
				got = got[:i+1]
			}
			want := append([]string{"fence taken"}, c.want...)
			if !slices.Equal(got, want) {
				t.Fatalf("load: %q, want %q", got, want)
			}
			if taken != 1 {
				t.Fatalf("StartLoad took %d fences, want 1", taken)
			}
			if c.fenceErr != nil {
				return
			}

			// A StartLoad with nothing bound takes no fence.
			if err := w.StartLoad(context.Background()); err != nil || taken != 1 {
				t.Fatalf("empty StartLoad: %v, %d fences", err, taken)
			}
			w.BindMeta(saves)
			if err := w.WaitForSave(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := w.WaitSaves(context.Background()); err != nil {
				t.Fatal(err)
			}
			got = log.take()
			if i := slices.Index(got, "gather"); i >= 0 {
				got = got[:i+1]
			}
			want = append([]string{"fence taken"}, c.want[0], "gather")
			if !slices.Equal(got, want) {
				t.Fatalf("save: %q, want %q", got, want)
			}
			if released {
				t.Fatal("a fence handed to the mover was released by the worker")
			}
		})
	}
}

// TestUnpassedFenceIsReleased: a load that fails before its copies releases the device fence
// it took, so its event is not kept.
func TestUnpassedFenceIsReleased(t *testing.T) {
	log := &orderLog{}
	released := false
	o := baseOptions()
	o.Fence = func() Fence { return deviceFence{hostFence: hostFence{log: log}, released: &released} }
	w, err := NewWorker(o, newMemPool(), orderMover{hostMover: newHostMover(testLayout(4)), log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	if err := w.RegisterLayout(testLayout(4)); err != nil {
		t.Fatal(err)
	}
	// Page 9 is outside the 4 slots: resolving the load fails before any copy.
	w.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "x", Pages: []PageTransfer{{Group: 0, Page: 9}}}}})
	if err := w.StartLoad(context.Background()); err == nil {
		t.Fatal("a load of a page outside the layout succeeded")
	}
	if !released {
		t.Fatalf("the fence was not released: %q", log.take())
	}
}
