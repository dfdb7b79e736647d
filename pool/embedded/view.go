package embedded

import (
	"context"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
)

// viewHold is what a view of the embedded pool holds: a reference on each offered object, so
// neither Remove nor eviction reuses its memory until the view is released.
type viewHold struct {
	e    *Embedded
	held []*object
}

// Corrupted implements pool.ViewHolder: the value counts as a checksum error, not a hit.
func (h *viewHold) Corrupted(size int64) {
	h.e.c.hits.Add(-1)
	h.e.c.bytesOut.Add(-size)
	h.e.c.checksumErrors.Add(1)
	h.e.c.getFailedItems.Add(1)
}

// Release implements pool.ViewHolder.
func (h *viewHold) Release() { h.e.releaseRefs(h.held) }

// BatchView implements pool.Viewer. The checks of a batch run on up to GOMAXPROCS-1 goroutines.
func (e *Embedded) BatchView(ctx context.Context, ks []string) *pool.View {
	out, held, misses := e.acquire(ctx, ks, nil)
	v := pool.NewView(0, false, &viewHold{e: e, held: held})
	v.Bufs, v.Codes = make([][]byte, len(ks)), out
	var total int64
	for _, o := range held {
		if o != nil {
			total += o.size
		}
	}
	e.forEachBeside(len(held), total, func(i int) {
		o := held[i]
		if o == nil {
			return
		}
		mem := o.seg.mem[o.off : o.off+o.size : o.off+o.size]
		if keys.PageChecksum(mem) != o.sum {
			out[i] = int64(pool.ErrChecksumMismatch)
			return
		}
		v.Bufs[i] = mem
		out[i] = o.size
	})
	e.finishGet(out, held, misses)
	return v
}

// BatchViewDeferred implements pool.DeferredViewer.
func (e *Embedded) BatchViewDeferred(ctx context.Context, ks []string) *pool.View {
	out, held, misses := e.acquire(ctx, ks, nil)
	v := pool.NewView(0, false, &viewHold{e: e, held: held})
	v.Bufs, v.Codes, v.Sums = make([][]byte, len(ks)), out, make([]uint64, len(ks))
	e.offerDeferred(v, held, misses)
	return v
}

// BatchViewDeferredInto implements pool.ReusingViewer. A view this pool filled before keeps
// its holder, so a reused view allocates nothing.
func (e *Embedded) BatchViewDeferredInto(ctx context.Context, ks [][]byte, v *pool.View) {
	h, ok := v.Holder().(*viewHold)
	if !ok || h.e != e {
		h = &viewHold{e: e}
	}
	h.held = pool.Zeroed(h.held, len(ks))
	v.Reset(len(ks), h)
	misses := acquireInto(ctx, e, ks, nil, v.Codes, h.held)
	e.offerDeferred(v, h.held, misses)
}

// offerDeferred fills a deferred view whose keys acquire looked up: each held value's memory,
// size and checksum at put.
func (e *Embedded) offerDeferred(v *pool.View, held []*object, misses int64) {
	for i, o := range held {
		if o == nil {
			continue
		}
		v.Bufs[i] = o.seg.mem[o.off : o.off+o.size : o.off+o.size]
		v.Sums[i] = uint64(o.sum)
		v.Codes[i] = o.size
	}
	e.finishGet(v.Codes, held, misses)
}

// MemoryRegions implements pool.Viewer.
func (e *Embedded) MemoryRegions() [][]byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([][]byte, len(e.segs))
	for i, s := range e.segs {
		out[i] = s.mem
	}
	return out
}

// BatchPutStart implements pool.Reserver. A call with len(sizes) != len(ks) fails every key.
func (e *Embedded) BatchPutStart(ctx context.Context, ks []string, sizes []int64, cfg pool.ReplicateConfig) *pool.PutReservation {
	if len(sizes) != len(ks) {
		e.c.putCalls.Add(1)
		out := e.failPut(make([]pool.Code, len(ks)), pool.ErrInvalidParams)
		return pool.NewPutReservation(make([][]byte, len(ks)), out, &reservation{e: e, out: out})
	}
	r := e.reserve(ctx, ks, func(i int) int64 { return sizes[i] }, cfg)
	bufs := make([][]byte, len(ks))
	for _, w := range r.work {
		o := w.o
		bufs[w.i] = o.seg.mem[o.off : o.off+o.size : o.off+o.size]
	}
	return pool.NewPutReservation(bufs, r.out, r)
}

// Commit implements pool.Committer (PutReservation.End): it takes each written value's
// checksum where it lies (on up to GOMAXPROCS-1 goroutines for large batches) and makes the
// values readable, with a lease of now.
func (r *reservation) Commit() []pool.Code {
	r.e.forEachBeside(len(r.work), r.bytes, func(j int) {
		o := r.work[j].o
		o.sum = keys.PageChecksum(o.seg.mem[o.off : o.off+o.size])
	})
	return r.commit()
}

// Revoke implements pool.Committer (PutReservation.Revoke): the memory goes back to the pool
// and every key that was to be written fails with ErrRPCFail.
func (r *reservation) Revoke() []pool.Code { return r.revoke() }

var (
	_ pool.Viewer         = (*Embedded)(nil)
	_ pool.DeferredViewer = (*Embedded)(nil)
	_ pool.ReusingViewer  = (*Embedded)(nil)
	_ pool.Reserver       = (*Embedded)(nil)
	_ pool.PieceCopier    = (*Embedded)(nil)
	_ pool.ViewHolder     = (*viewHold)(nil)
	_ pool.Committer      = (*reservation)(nil)
)
