package connector

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// bufRecordingPool is the pool double that reads into the caller's buffers, as a Mooncake
// cluster's client does, and records every buffer a get was handed.
type bufRecordingPool struct {
	*memPool
	mu    sync.Mutex
	bufs  [][]byte
	calls []int // pages asked for, per get
}

func (p *bufRecordingPool) BatchGet(ctx context.Context, keys []string, bufs [][]byte) []int64 {
	p.mu.Lock()
	p.bufs = append(p.bufs, bufs...)
	p.calls = append(p.calls, len(keys))
	p.mu.Unlock()
	return p.memPool.BatchGet(ctx, keys, bufs)
}

// within reports whether b lies inside mem.
func within(b, mem []byte) bool {
	if len(b) == 0 || len(mem) == 0 {
		return false
	}
	lo, hi := uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&mem[0]))+uintptr(len(mem))
	p := uintptr(unsafe.Pointer(&b[0]))
	return p >= lo && p+uintptr(len(b)) <= hi
}

// moverMapping returns the engine memory the mover maps (its own mapping of the memfd), found
// from the first page PageMemory hands out.
func moverMapping(t *testing.T, m kvmem.Mover, l kvmem.Layout) []byte {
	t.Helper()
	hp := m.(kvmem.HostPages)
	for g := range l.Groups {
		ref := kvmem.PageRef{Group: g}
		if mem, ok := hp.PageMemory(ref); ok {
			off, _, _ := l.ContiguousValue(ref)
			return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&mem[0]), -int(off))), layoutBytes(l))
		}
	}
	t.Fatal("no page of the layout is one piece of engine memory")
	return nil
}

// contiguousLayout has pages whose values are one piece of engine memory: group 0 one region
// per slot, group 1 two regions back to back in each slot.
func contiguousLayout(slots int) kvmem.Layout {
	s := uint64(slots)
	return kvmem.Layout{TokensPerBlock: testT, Groups: []kvmem.GroupLayout{
		{ID: 0, Slots: slots, Regions: []kvmem.Region{{Offset: 0, Stride: 48, Size: 48}}},
		{ID: 1, Slots: slots, Regions: []kvmem.Region{{Offset: 48 * s, Stride: 40, Size: 16}, {Offset: 48*s + 16, Stride: 40, Size: 24}}},
	}}
}

func layoutBytes(l kvmem.Layout) int64 {
	var size uint64
	for _, g := range l.Groups {
		for _, set := range [][]kvmem.Region{g.Regions, g.ReplicatedRegions} {
			for _, r := range set {
				size = max(size, r.Offset+r.Stride*uint64(g.Slots-1)+r.Size)
			}
		}
	}
	return int64(size)
}

// TestLoadsReadStraightIntoHostEngineMemory loads pages from a pool that reads into the
// caller's buffers (a Mooncake cluster) into shared engine memory (the real core/hostmem mover):
// where every value is one piece of engine memory the pool is handed the engine's own pages,
// no staging slot, and the bytes land in the right slots; a request whose page is missing fails
// and its slot keeps its poison, while the other request in the same call loads. Where values
// are split across regions (K and V apart), the load stages as before and the bytes still land.
// Asynchronous loads (a load worker's clone of the mover) do the same.
func TestLoadsReadStraightIntoHostEngineMemory(t *testing.T) {
	const n = 6
	for _, c := range []struct {
		name   string
		layout kvmem.Layout
		direct bool
		async  bool
	}{
		{"contiguous values", contiguousLayout(16), true, false},
		{"split values", testLayout(16), false, false},
		{"async/contiguous values", contiguousLayout(16), true, true},
		{"async/split values", testLayout(16), false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.layout
			pool := &bufRecordingPool{memPool: newMemPool()}
			ns := baseOptions().Namespace
			want := map[kvmem.PageRef][]byte{} // by the slot it must land in
			var pages []PageTransfer
			for i := range n {
				for g := range l.Groups {
					v := bytes.Repeat([]byte{byte(16*g + i + 1)}, int(l.Groups[g].BytesPerPage()))
					if i != 3 || g != 0 { // page 3 of group 0 was never saved
						pool.objs[ns.PageKey(g, testT, l.Groups[g].BytesPerPage(), directHash(i))] = v
					}
					want[kvmem.PageRef{Group: g, Slot: 10 - i}] = v
					if rb := l.Groups[g].ReplicatedBytesPerPage(); rb > 0 {
						r := bytes.Repeat([]byte{byte(0x80 + 16*g + i)}, int(rb))
						pool.objs[ns.ReplicatedPageKey(g, testT, rb, directHash(i))] = r
						want[kvmem.PageRef{Group: g, Slot: 10 - i, Replicated: true}] = r
					}
				}
			}
			for i := range 3 {
				pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 10 - i}, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: 10 - i})
			}
			var missing []PageTransfer
			for i := 3; i < n; i++ {
				missing = append(missing, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 10 - i})
			}

			shm, err := hostmem.NewSharedMemory(layoutBytes(l))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = shm.Close() })
			for i := range shm.Data {
				shm.Data[i] = 0xEE
			}
			m, err := hostmem.NewMover(shm.FD, int64(len(shm.Data)), l)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			loads := []RequestTransfers{{RequestID: "a", Pages: pages}, {RequestID: "b", Pages: missing}}
			if f := failedLoads(t, c.async, pool, m, l, loads); !slices.Equal(f, []string{"b"}) {
				t.Fatalf("async %t: failed loads %v, want [b]", c.async, f)
			}
			if len(pool.bufs) == 0 {
				t.Fatal("the pool was never asked for a page")
			}
			mapped := moverMapping(t, m, l)
			for i, b := range pool.bufs {
				if within(b, mapped) != c.direct {
					t.Fatalf("get buffer %d inside engine memory: %v, want %v", i, within(b, mapped), c.direct)
				}
			}
			got := make([][]byte, 1)
			for ref, v := range want {
				if ref.Slot <= 7 {
					continue // request b's
				}
				got[0] = make([]byte, len(v))
				if err := m.Gather(context.Background(), []kvmem.PageRef{ref}, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[0], v) {
					t.Fatalf("%+v holds %x, want %x", ref, got[0], v)
				}
			}
			// Request b lost page 3 first, so nothing of it may have landed in slot 7.
			ref := kvmem.PageRef{Group: 0, Slot: 7}
			got[0] = make([]byte, l.Groups[0].BytesPerPage())
			if err := m.Gather(context.Background(), []kvmem.PageRef{ref}, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got[0], bytes.Repeat([]byte{0xEE}, len(got[0]))) {
				t.Fatalf("slot 7 of the failed request holds %x", got[0])
			}
		})
	}
}

// failedLoads binds loads on a fresh worker over pool pl and mover m (layout l) and makes them,
// as synchronous loads through StartLoad or, with async, as parked requests on one load worker;
// it returns the requests handed back as failed, sorted.
func failedLoads(t *testing.T, async bool, pl pool.Pool, m kvmem.Mover, l kvmem.Layout, loads []RequestTransfers) []string {
	t.Helper()
	if async {
		o := baseOptions()
		o.AsyncLoad, o.AsyncLoadWorkers = true, 1
		w := registeredWorkerWith(t, o, pl, m, l)
		w.BindMeta(Metadata{AsyncLoads: loads})
		ids := make([]string, len(loads))
		for i, r := range loads {
			ids[i] = r.RequestID
		}
		return finishAsyncLoads(t, w, ids...)
	}
	w := registeredWorker(t, pl, m, l)
	w.BindMeta(Metadata{Loads: loads})
	if err := w.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	failed := w.TakeFailedLoadRequests()
	slices.Sort(failed)
	return failed
}

// saveAndWait saves pages as request id through w and waits, as an idle engine does in
// GetFinishedWait, until the save is reported finished.
func saveAndWait(t *testing.T, w *Worker, id string, pages []PageTransfer) {
	t.Helper()
	w.BindMeta(Metadata{Saves: []RequestTransfers{{RequestID: id, Pages: pages}}})
	if err := w.WaitForSave(context.Background()); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		done, _, err := w.GetFinishedWait(context.Background(), []string{id}, nil, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(done, id) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the save of %s never finished", id)
		}
	}
}

// finishAsyncLoads announces the parked requests ids and polls GetFinished until every one of
// their asynchronous loads is done; it returns those handed back as failed.
func finishAsyncLoads(t *testing.T, w *Worker, ids ...string) []string {
	t.Helper()
	var failed []string
	announce, left := ids, len(ids)
	for deadline := time.Now().Add(30 * time.Second); left > 0; announce = nil {
		if time.Now().After(deadline) {
			t.Fatalf("asynchronous loads of %v not finished", ids)
		}
		_, done, err := w.GetFinished(nil, announce)
		if err != nil {
			t.Fatal(err)
		}
		left -= len(done)
		failed = append(failed, w.TakeFailedAsyncLoadRequests()...)
		time.Sleep(time.Millisecond)
	}
	slices.Sort(failed)
	return failed
}

// TestDirectLoadBatches pins how a synchronous load that reads straight into host engine memory
// splits into pool calls: by bytes (directBatchBytes), not by transfer_batch_size, so three
// requests of four pages with transfer_batch_size 2 are one call; two calls when
// directBatchBytes holds eight pages; and transfer_batch_size pages a call with
// directHostBatchOff (the staged loads' rule). Every page lands in its slot each time.
func TestDirectLoadBatches(t *testing.T) {
	l := contiguousLayout(16)
	page := int(l.Groups[0].BytesPerPage() + l.Groups[1].BytesPerPage()) // a block's two pages
	for _, c := range []struct {
		name      string
		batch     int // directBatchBytes
		off       bool
		wantCalls []int
	}{
		{"by bytes", 64 << 20, false, []int{24}},
		{"eight pages a call", 4 * page, false, []int{8, 8, 8}},
		{"transfer_batch_size", 64 << 20, true, []int{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			oldBytes, oldOff := directBatchBytes, directHostBatchOff
			directBatchBytes, directHostBatchOff = c.batch, c.off
			defer func() { directBatchBytes, directHostBatchOff = oldBytes, oldOff }()
			pl := &bufRecordingPool{memPool: newMemPool()}
			ns := baseOptions().Namespace
			var loads []RequestTransfers
			want := map[kvmem.PageRef][]byte{}
			for r := range 3 {
				rt := RequestTransfers{RequestID: string(rune('a' + r))}
				for i := range 4 {
					blk := 4*r + i
					for g := range l.Groups {
						v := bytes.Repeat([]byte{byte(16*g + blk + 1)}, int(l.Groups[g].BytesPerPage()))
						pl.objs[ns.PageKey(g, testT, l.Groups[g].BytesPerPage(), directHash(blk))] = v
						want[kvmem.PageRef{Group: g, Slot: 15 - blk}] = v
						rt.Pages = append(rt.Pages, PageTransfer{Hash: keys.PageHashOf(directHash(blk)), Group: g, Page: 15 - blk})
					}
				}
				loads = append(loads, rt)
			}
			shm, err := hostmem.NewSharedMemory(layoutBytes(l))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = shm.Close() })
			m, err := hostmem.NewMover(shm.FD, int64(len(shm.Data)), l)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = m.Close() })
			o := baseOptions()
			o.TransferBatchSize = 2
			w := registeredWorkerWith(t, o, pl, m, l)
			w.BindMeta(Metadata{Loads: loads})
			if err := w.StartLoad(context.Background()); err != nil {
				t.Fatal(err)
			}
			if f := w.TakeFailedLoadRequests(); len(f) != 0 {
				t.Fatalf("failed loads %v", f)
			}
			if !slices.Equal(pl.calls, c.wantCalls) {
				t.Errorf("pages per pool call %v, want %v", pl.calls, c.wantCalls)
			}
			mapped := moverMapping(t, m, l)
			for i, b := range pl.bufs {
				if !within(b, mapped) {
					t.Fatalf("get buffer %d is not engine memory", i)
				}
			}
			got := make([][]byte, 1)
			for ref, v := range want {
				got[0] = make([]byte, len(v))
				if err := m.Gather(context.Background(), []kvmem.PageRef{ref}, got); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[0], v) {
					t.Fatalf("%+v holds %x, want %x", ref, got[0], v)
				}
			}
		})
	}
}

// TestContiguousValue pins which values Layout.ContiguousValue finds in one piece.
func TestContiguousValue(t *testing.T) {
	l := contiguousLayout(4)
	for _, c := range []struct {
		ref       kvmem.PageRef
		off, size uint64
		ok        bool
	}{
		{kvmem.PageRef{Group: 0, Slot: 2}, 96, 48, true},
		{kvmem.PageRef{Group: 1, Slot: 3}, 48*4 + 120, 40, true},
		{kvmem.PageRef{Group: 1, Slot: 4}, 0, 0, false},
		{kvmem.PageRef{Group: 2, Slot: 0}, 0, 0, false},
		{kvmem.PageRef{Group: 1, Slot: 0, Replicated: true}, 0, 0, false},
	} {
		off, size, ok := l.ContiguousValue(c.ref)
		if off != c.off || size != c.size || ok != c.ok {
			t.Errorf("%+v: %d, %d, %v; want %d, %d, %v", c.ref, off, size, ok, c.off, c.size, c.ok)
		}
	}
	split := testLayout(4) // K and V of a slot lie apart
	if _, _, ok := split.ContiguousValue(kvmem.PageRef{Group: 0, Slot: 1}); ok {
		t.Error("a value split into K and V regions taken for one piece")
	}
}
