package connector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// TestLoadListsReusedAcrossLoads runs StartLoads of different sizes, several batches each, on
// one worker whose lists are kept between them, for every way a load reads the pool (staged,
// in place checked on the host, checked by the mover after each copy with views into reused
// Views or with keys as strings, issued without waiting). A page evicted from the pool after
// the previous load fails exactly its request and leaves the slot it would have filled alone;
// every other page lands with the saved bytes, a smaller load after a larger one included; the
// lists, and the views, are the same ones throughout.
func TestLoadListsReusedAcrossLoads(t *testing.T) {
	oldDirect, oldChecked := directBatchBytes, directCheckedBatchBytes
	directBatchBytes, directCheckedBatchBytes = 4*64, 4*64 // a few pages a batch
	defer func() { directBatchBytes, directCheckedBatchBytes = oldDirect, oldChecked }()
	const saved = 12
	for _, kind := range []string{"staged", "in-place", "checked", "checked-strings", "issued"} {
		t.Run(kind, func(t *testing.T) {
			pl := newEmbPool(t, 1<<20)
			l := testLayout(64)
			src := saveDirectPages(t, pl, l, saved)
			var m kvmem.Mover
			var got *hostMover
			o := baseOptions()
			switch kind {
			case "staged":
				o.StagedTransfers = true
				o.StagingBufferBytes = 4 * 48 // two sets of two slots: many pool calls
				rm := newRegisteringMover(l)
				m, got = rm, rm.hostMover
			case "in-place":
				rm := newRegisteringMover(l)
				m, got = rm, rm.hostMover
			case "checked", "checked-strings":
				cm := newCheckingMover(l)
				m, got = cm, cm.hostMover
			case "issued":
				var batches []int
				im := issuingMover{newCheckingMover(l), new(atomic.Int32), &batches}
				m, got = im, im.hostMover
			}
			for i := range got.mem {
				got.mem[i] = 0xEE
			}
			var wp pool.Pool = pl
			if kind == "checked-strings" {
				wp = stringViewPool{pl, pl.Embedded}
			}
			w := registeredWorkerWith(t, o, wp, m, l)
			deferred, _ := gpuPageChecks(w.direct, w.mover)
			_, into := deferred.(pool.ReusingViewer)
			if wantInto := kind == "checked" || kind == "issued"; into != wantInto {
				t.Fatalf("views into reused Views: %v, want %v", into, wantInto)
			}
			ns := o.Namespace

			// load requests r<i> for the saved pages first..first+n-1, both groups, into slots
			// at+i, and check that exactly the requests in lost failed and that every other
			// page landed.
			load := func(first, n, at int, lost map[int]bool) {
				t.Helper()
				var reqs []RequestTransfers
				for i := first; i < first+n; i++ {
					reqs = append(reqs, RequestTransfers{RequestID: fmt.Sprintf("r%02d", i), Pages: []PageTransfer{
						{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: at + i - first}, {Hash: keys.PageHashOf(directHash(i)), Group: 1, Page: at + i - first}}})
				}
				w.BindMeta(Metadata{Loads: reqs})
				if err := w.StartLoad(context.Background()); err != nil {
					t.Fatal(err)
				}
				failed := w.TakeFailedLoadRequests()
				var want []string
				for i := first; i < first+n; i++ {
					if lost[i] {
						want = append(want, fmt.Sprintf("r%02d", i))
					}
				}
				if !slices.Equal(failed, want) {
					t.Fatalf("failed loads %v, want %v", failed, want)
				}
				for i := first; i < first+n; i++ {
					slot := at + i - first
					if lost[i] {
						if b := pageBytes(got, 0, slot, false); !bytes.Equal(b, bytes.Repeat([]byte{0xEE}, len(b))) {
							t.Fatalf("slot %d: the evicted page's slot was written", slot)
						}
						continue
					}
					for g := range 2 {
						if !bytes.Equal(pageBytes(got, g, slot, false), pageBytes(src, g, i, false)) {
							t.Fatalf("slot %d group %d: not the saved page %d", slot, g, i)
						}
					}
					if !bytes.Equal(pageBytes(got, 1, slot, true), pageBytes(src, 1, i, true)) {
						t.Fatalf("slot %d: replicated value is not the saved page %d's", slot, i)
					}
				}
			}

			load(0, 8, 0, nil)
			lists := w.syncLists.Load()
			if lists == nil {
				t.Fatal("the load's lists were not kept")
			}
			views := slices.Clone(lists.views)
			if into && len(views) < 2 {
				t.Fatalf("%d views kept: a load of several batches into reused Views is not under test", len(views))
			}
			// Evicted after the load that looked it up: its request fails, never wrong bytes.
			if !pl.evict(ns.PageKey(0, testT, l.Groups[0].BytesPerPage(), directHash(5))) {
				t.Fatal("page 5 was not in the pool")
			}
			load(2, 10, 16, map[int]bool{5: true})
			load(9, 3, 40, nil) // fewer pages than the lists hold
			load(0, 4, 48, nil)
			if w.syncLists.Load() != lists {
				t.Fatal("a later load did not reuse the kept lists")
			}
			if len(views) > 0 && lists.views[0] != views[0] {
				t.Fatal("a later load did not reuse the kept views")
			}
			if st := pl.stats(t); st.ChecksumErrors != 0 {
				t.Fatalf("%d checksum errors", st.ChecksumErrors)
			}
		})
	}
}

// stringViewPool is the embedded pool without views into reused Views: its deferred views take
// their keys as strings, as a pool's that is a DeferredViewer and not a ReusingViewer.
type stringViewPool struct {
	pool.Pool
	e *embedded.Embedded
}

func (p stringViewPool) BatchView(ctx context.Context, ks []string) *pool.View {
	return p.e.BatchView(ctx, ks)
}

func (p stringViewPool) BatchViewDeferred(ctx context.Context, ks []string) *pool.View {
	return p.e.BatchViewDeferred(ctx, ks)
}

func (p stringViewPool) MemoryRegions() [][]byte { return p.e.MemoryRegions() }

func (p stringViewPool) BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg pool.ReplicateConfig) *pool.PutReservation {
	return p.e.BatchPutStart(ctx, ks, sizes, cfg)
}

// TestLargeLoadListsNotKept: the lists of a load of more values than maxKeptLoadLists are
// dropped once it is done; the next load makes lists of its own size and keeps them.
func TestLargeLoadListsNotKept(t *testing.T) {
	const n = maxKeptLoadLists + 1
	pl := newEmbPool(t, 4<<20)
	l := testLayout(n)
	saveDirectPages(t, pl, l, n)
	w := registeredWorker(t, pl, newRegisteringMover(l), l)
	loadGroup0 := func(n int) {
		t.Helper()
		var pages []PageTransfer
		for i := range n {
			pages = append(pages, PageTransfer{Hash: keys.PageHashOf(directHash(i)), Group: 0, Page: i})
		}
		w.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "r", Pages: pages}}})
		if err := w.StartLoad(context.Background()); err != nil {
			t.Fatal(err)
		}
		if f := w.TakeFailedLoadRequests(); len(f) != 0 {
			t.Fatalf("failed loads %v", f)
		}
	}
	loadGroup0(n)
	if w.syncLists.Load() != nil {
		t.Fatalf("the lists of a load of %d values were kept", n)
	}
	loadGroup0(16)
	if l := w.syncLists.Load(); l == nil || len(l.keys) != 16 {
		t.Fatal("the lists of a small load were not kept at its size")
	}
}

// lostCheckMover is checkingMover whose checks fail, as a device lost mid-load does.
type lostCheckMover struct{ checkingMover }

func (m lostCheckMover) ScatterChecked(ctx context.Context, src [][]byte, pages []kvmem.PageRef, _ []uint64) (func() ([]bool, error), error) {
	if err := m.Scatter(ctx, src, pages); err != nil {
		return nil, err
	}
	return func() ([]bool, error) { return nil, errors.New("device lost") }, nil
}

// TestFailedLoadListsNotKept: the lists of a load that failed (a view of one of its batches may
// still be held) are not kept for the next load.
func TestFailedLoadListsNotKept(t *testing.T) {
	pl := newEmbPool(t, 1<<20)
	l := testLayout(32)
	saveDirectPages(t, pl, l, 4)
	w := registeredWorker(t, pl, lostCheckMover{newCheckingMover(l)}, l)
	w.BindMeta(Metadata{Loads: []RequestTransfers{{RequestID: "r", Pages: []PageTransfer{{Hash: keys.PageHashOf(directHash(1)), Group: 0, Page: 3}}}}})
	if err := w.StartLoad(context.Background()); err == nil {
		t.Fatal("a load whose check failed succeeded")
	}
	if w.syncLists.Load() != nil {
		t.Fatal("the lists of a failed load were kept")
	}
}
