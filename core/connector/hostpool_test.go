package connector

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// recordingEmbPool is the embedded pool (real) recording the buffers its copying calls were
// handed and counting its in-place calls; its Viewer and Reserver methods are the pool's own.
type recordingEmbPool struct {
	*embPool
	mu                   sync.Mutex
	getBufs, putBufs     [][]byte // BatchGet's and BatchPut's buffers
	getPieces, putPieces [][]byte // BatchGetPieces' and BatchPutPieces' pieces
	pieceGets, piecePuts []int    // values per BatchGetPieces and BatchPutPieces call
	views, reservations  int
}

func (p *recordingEmbPool) BatchGetPieces(ctx context.Context, ks []string, dsts [][][]byte) []int64 {
	p.mu.Lock()
	for _, d := range dsts {
		p.getPieces = append(p.getPieces, d...)
	}
	p.pieceGets = append(p.pieceGets, len(dsts))
	p.mu.Unlock()
	return p.embPool.BatchGetPieces(ctx, ks, dsts)
}

func (p *recordingEmbPool) BatchPutPieces(ctx context.Context, ks []string, srcs [][][]byte, cfg pool.ReplicateConfig) []pool.Code {
	p.mu.Lock()
	for _, s := range srcs {
		p.putPieces = append(p.putPieces, s...)
	}
	p.piecePuts = append(p.piecePuts, len(srcs))
	p.mu.Unlock()
	return p.embPool.BatchPutPieces(ctx, ks, srcs, cfg)
}

func (p *recordingEmbPool) BatchGet(ctx context.Context, ks []string, bufs [][]byte) []int64 {
	p.mu.Lock()
	p.getBufs = append(p.getBufs, bufs...)
	p.mu.Unlock()
	return p.embPool.BatchGet(ctx, ks, bufs)
}

func (p *recordingEmbPool) BatchPut(ctx context.Context, ks []string, bufs [][]byte, cfg pool.ReplicateConfig) []pool.Code {
	p.mu.Lock()
	p.putBufs = append(p.putBufs, bufs...)
	p.mu.Unlock()
	return p.embPool.BatchPut(ctx, ks, bufs, cfg)
}

func (p *recordingEmbPool) BatchView(ctx context.Context, ks []string) *pool.View {
	p.mu.Lock()
	p.views++
	p.mu.Unlock()
	return p.embPool.BatchView(ctx, ks)
}

func (p *recordingEmbPool) BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg pool.ReplicateConfig) *pool.PutReservation {
	p.mu.Lock()
	p.reservations++
	p.mu.Unlock()
	return p.embPool.BatchPutStart(ctx, ks, sizes, cfg)
}

// sharedEngineMemory returns the real shared-memory mover (what kvctl serve maps for an engine
// whose KV cache is a memfd) over fresh memory for l filled with fill(i), and that memory.
func sharedEngineMemory(t *testing.T, l kvmem.Layout, fill func(i int) byte) (kvmem.Mover, []byte) {
	t.Helper()
	shm, err := hostmem.NewSharedMemory(layoutBytes(l))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = shm.Close() })
	for i := range shm.Data {
		shm.Data[i] = fill(i)
	}
	m, err := hostmem.NewMover(shm.FD, int64(len(shm.Data)), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	// The mover's own mapping, found from the first piece of slot 0's value.
	ref := kvmem.PageRef{Group: 0}
	segs, ok := m.(kvmem.HostPages).PageSegments(ref, nil)
	spans, err := l.ValueSpans(ref, nil)
	if !ok || err != nil {
		t.Fatalf("no engine memory for %+v: %v", ref, err)
	}
	base := unsafe.Add(unsafe.Pointer(&segs[0][0]), -int(spans[0].Offset))
	return m, unsafe.Slice((*byte)(base), layoutBytes(l))
}

// readPage reads ref's value out of engine memory through the mover.
func readPage(t *testing.T, m kvmem.Mover, l kvmem.Layout, ref kvmem.PageRef) []byte {
	t.Helper()
	got := [][]byte{make([]byte, l.Groups[ref.Group].BytesPerPage())}
	if err := m.Gather(context.Background(), []kvmem.PageRef{ref}, got); err != nil {
		t.Fatal(err)
	}
	return got[0]
}

// TestHostEngineMemoryAndTheEmbeddedPool runs saves and loads between shared engine memory (the
// real core/hostmem mover) and the embedded pool, whose memory could be read and written in
// place. The pool is handed the engine's own memory instead, in one pass that copies and
// checksums each value (no gather, no view, no reservation): the value itself where it is one
// piece of engine memory (BatchGet, BatchPut), its pieces where it is split across regions
// (BatchGetPieces, BatchPutPieces). Either way the pool holds the engine's bytes, verified on
// read, a load puts them in the right slots of another engine, a corrupted stored page fails its
// request and is counted, and the other request of the call loads, synchronously and through an
// asynchronous load worker.
func TestHostEngineMemoryAndTheEmbeddedPool(t *testing.T) {
	for _, c := range []struct {
		name   string
		layout kvmem.Layout
		direct bool
	}{
		{"contiguous values", contiguousLayout(16), true},
		{"split values", testLayout(16), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.layout
			pl := &recordingEmbPool{embPool: newEmbPool(t, 1<<20)}
			ns := baseOptions().Namespace

			// Save slots 0–5 of one engine.
			src, srcMem := sharedEngineMemory(t, l, func(i int) byte { return byte(i*7 + 3) })
			w := registeredWorker(t, pl, src, l)
			var pages []PageTransfer
			for i := range 6 {
				for g := range l.Groups {
					pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: g, Page: i})
				}
			}
			saveAndWait(t, w, "saver", pages)
			pl.mu.Lock()
			putBufs, putPieces, reservations := pl.putBufs, pl.putPieces, pl.reservations
			pl.mu.Unlock()
			for i, b := range slices.Concat(putBufs, putPieces) {
				if !within(b, srcMem) {
					t.Errorf("put buffer or piece %d is not engine memory", i)
				}
			}
			if c.direct && (len(putBufs) != len(pages) || len(putPieces) != 0 || reservations != 0) {
				t.Fatalf("%d values put from engine memory, %d pieces, %d reservations; want %d, 0 and 0", len(putBufs), len(putPieces), reservations, len(pages))
			}
			if !c.direct && (len(putBufs) != 0 || len(putPieces) < len(pages) || reservations != 0) {
				t.Fatalf("split values: %d values put, %d pieces, %d reservations; want 0, at least %d and 0", len(putBufs), len(putPieces), reservations, len(pages))
			}
			for i := range 6 {
				for g := range l.Groups {
					key := ns.PageKey(g, testT, l.Groups[g].BytesPerPage(), directHash(i))
					want := readPage(t, src, l, kvmem.PageRef{Group: g, Slot: i})
					got := make([]byte, len(want))
					if n := pl.embPool.BatchGet(context.Background(), []string{key}, [][]byte{got}); n[0] != int64(len(want)) || !bytes.Equal(got, want) {
						t.Fatalf("pool holds %d bytes under %s, not the engine's page", n[0], key)
					}
				}
			}

			bad := ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(2))
			if !pl.CorruptForTest(bad) {
				t.Fatalf("no stored page %q", bad)
			}
			for _, async := range []bool{false, true} {
				pl.mu.Lock()
				pl.getBufs, pl.getPieces, pl.views = nil, nil, 0
				pl.mu.Unlock()
				before := pl.stats(t).ChecksumErrors
				dst, dstMem := sharedEngineMemory(t, l, func(int) byte { return 0xEE })
				// Request a: pages 0, 1, 3 of every group into slots 10, 11, 13; request b: page 2
				// (corrupted in the pool) of group 0 into slot 12.
				var a []PageTransfer
				for _, i := range []int{0, 1, 3} {
					for g := range l.Groups {
						a = append(a, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: g, Page: 10 + i})
					}
				}
				loads := []RequestTransfers{{RequestID: "a", Pages: a}, {RequestID: "b", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(2)), Group: 0, Page: 12}}}}
				if f := failedLoads(t, async, pl, dst, l, loads); !slices.Equal(f, []string{"b"}) {
					t.Fatalf("async %t: failed loads %v, want [b]", async, f)
				}
				for _, i := range []int{0, 1, 3} {
					for g := range l.Groups {
						want := readPage(t, src, l, kvmem.PageRef{Group: g, Slot: i})
						if got := readPage(t, dst, l, kvmem.PageRef{Group: g, Slot: 10 + i}); !bytes.Equal(got, want) {
							t.Fatalf("async=%v: group %d slot %d does not hold page %d", async, g, 10+i, i)
						}
					}
				}
				if got := pl.stats(t).ChecksumErrors - before; got != 1 {
					t.Fatalf("async=%v: pool counted %d checksum errors, want 1", async, got)
				}
				pl.mu.Lock()
				getBufs, getPieces, views := pl.getBufs, pl.getPieces, pl.views
				pl.mu.Unlock()
				direct, pieces := len(getBufs), len(getPieces)
				if !c.direct {
					direct, pieces = pieces, direct
				}
				if views != 0 || direct == 0 || pieces != 0 {
					t.Fatalf("async=%v: %d views, %d values copied whole, %d pieces; want every value copied into engine memory (contiguous: %v)", async, views, len(getBufs), len(getPieces), c.direct)
				}
				for i, b := range slices.Concat(getBufs, getPieces) {
					if !within(b, dstMem) {
						t.Fatalf("async=%v: get buffer or piece %d is not engine memory", async, i)
					}
				}
			}
		})
	}
}

// TestPieceBatchesAreBounded: a pool call through values' pieces names at most maxBatchPieces
// pieces (a layer group may have thousands of regions), so a load and a save of six pages of
// four pieces each, with room for eight pieces a call, go as three calls of two values each, and
// every byte still lands.
func TestPieceBatchesAreBounded(t *testing.T) {
	old := maxBatchPieces
	maxBatchPieces = 8
	defer func() { maxBatchPieces = old }()
	const slots = 8
	var rs []kvmem.Region
	for r := range 4 { // four regions apart: four pieces a value
		rs = append(rs, kvmem.Region{Offset: uint64(r) * 64 * slots, Stride: 64, Size: 48})
	}
	l := kvmem.Layout{TokensPerBlock: testT, Groups: []kvmem.GroupLayout{{ID: 0, Slots: slots, Regions: rs}}}
	pl := &recordingEmbPool{embPool: newEmbPool(t, 1<<20)}
	src, _ := sharedEngineMemory(t, l, func(i int) byte { return byte(i*5 + 1) })
	var saves, loads []PageTransfer
	for i := range 6 {
		saves = append(saves, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: i})
		loads = append(loads, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: 7 - i})
	}
	w := registeredWorker(t, pl, src, l)
	saveAndWait(t, w, "s", saves)
	dst, _ := sharedEngineMemory(t, l, func(int) byte { return 0xEE })
	w2 := registeredWorker(t, pl, dst, l)
	w2.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "l", Pages: loads}}})
	if err := w2.StartLoad(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f := w2.TakeFailedLoadRequests(); len(f) > 0 {
		t.Fatalf("failed loads %v", f)
	}
	pl.mu.Lock()
	puts, gets := pl.piecePuts, pl.pieceGets
	pl.mu.Unlock()
	if !slices.Equal(puts, []int{2, 2, 2}) || !slices.Equal(gets, []int{2, 2, 2}) {
		t.Fatalf("values per call: puts %v, gets %v; want three calls of two each", puts, gets)
	}
	for i := range 6 {
		want := readPage(t, src, l, kvmem.PageRef{Group: 0, Slot: i})
		if got := readPage(t, dst, l, kvmem.PageRef{Group: 0, Slot: 7 - i}); !bytes.Equal(got, want) {
			t.Fatalf("slot %d does not hold page %d", 7-i, i)
		}
	}
}
