package daemon

import (
	"context"
	"time"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/pool"
)

// inPlacePool is the guarded pool for a backend whose memory is in this process (the embedded
// pool): it adds the backend's in-place calls (pool.Viewer, pool.Reserver), counted as
// the guard counts gets and puts, so the connectors register that memory with the GPU and copy
// pages straight between it and engine memory instead of through staging
// (docs/perf/serve-gpu.md).
type inPlacePool struct {
	*guardedPool
	v pool.Viewer
	r pool.Reserver
	// corrupt counts a page a deferred view's caller found corrupt (View.OnCorrupt): made once
	// rather than per view.
	corrupt func()
}

// connectorPool is the pool the daemon hands a connector: the guarded pool, with the in-place
// calls when the backend is the embedded pool and has them. A Mooncake backend keeps its values
// in segments reached over the Transfer Engine, so it has no in-place calls; it reads and
// writes values split across regions of host engine memory straight from their pieces
// (pool.PieceCopier), as it does values that lie in one piece.
func (d *Daemon) connectorPool() pool.Pool {
	if d.backend.Info.Kind != statsapi.BackendEmbedded {
		if pc, ok := d.backend.Pool.(pool.PieceCopier); ok {
			return &piecePool{guardedPool: d.guard, pieceCalls: pieceCalls{g: d.guard, pc: pc}}
		}
		return d.pool
	}
	v, ok := d.backend.Pool.(pool.Viewer)
	if !ok {
		return d.pool
	}
	r, ok := d.backend.Pool.(pool.Reserver)
	if !ok {
		return d.pool
	}
	p := &inPlacePool{guardedPool: d.guard, v: v, r: r}
	p.corrupt = func() { p.failed("get", &p.loadPages, 1) }
	pc, pieces := d.backend.Pool.(pool.PieceCopier)
	if rv, ok := d.backend.Pool.(pool.ReusingViewer); ok {
		rp := &reusingInPlacePool{inPlacePool: p, rv: rv}
		if pieces {
			return &pieceReusingInPlacePool{reusingInPlacePool: rp, pieceCalls: pieceCalls{g: d.guard, pc: pc}}
		}
		return rp
	}
	if pieces {
		return &pieceInPlacePool{inPlacePool: p, pieceCalls: pieceCalls{g: d.guard, pc: pc}}
	}
	return p
}

// pieceCalls are the backend's copies into and out of values' pieces (pool.PieceCopier),
// guarded and counted as BatchGet and BatchPut by g, so that a connector over host engine memory
// moves each page between the pool and engine memory in one pass even where its values are split
// across regions. piecePool, pieceInPlacePool and pieceReusingInPlacePool add them to the
// guarded pool and to its in-place kinds.
type pieceCalls struct {
	g  *guardedPool
	pc pool.PieceCopier
}

func (c pieceCalls) BatchGetPieces(ctx context.Context, keys []string, dsts [][][]byte) []int64 {
	return c.g.getPieces(ctx, c.pc, keys, dsts)
}

func (c pieceCalls) BatchPutPieces(ctx context.Context, keys []string, srcs [][][]byte, cfg pool.ReplicateConfig) []pool.Code {
	return c.g.putPieces(ctx, c.pc, keys, srcs, cfg)
}

type piecePool struct {
	*guardedPool
	pieceCalls
}

type pieceInPlacePool struct {
	*inPlacePool
	pieceCalls
}

type pieceReusingInPlacePool struct {
	*reusingInPlacePool
	pieceCalls
}

// reusingInPlacePool is inPlacePool over a backend whose deferred views also take keys as bytes
// into a View the caller reuses (pool.ReusingViewer), so a load's views allocate nothing.
type reusingInPlacePool struct {
	*inPlacePool
	rv pool.ReusingViewer
}

// BatchViewDeferredInto is BatchViewDeferred into the caller's view, counted the same way.
func (p *reusingInPlacePool) BatchViewDeferredInto(ctx context.Context, keys [][]byte, v *pool.View) {
	began := time.Now()
	p.rv.BatchViewDeferredInto(ctx, keys, v)
	p.countView(ctx, began, v)
	v.OnCorrupt(p.corrupt)
}

// BatchView checks and counts the pages it did not offer, as BatchGet.
//
// A view, unlike the guard's other calls, carries no deadline of its own: the backend answers
// it from its memory, under its lock, and waits on nothing a deadline could cut off, so a timer
// per call (a StartLoad makes one view per batch) would bound nothing. A view that ran past the
// pool timeout, or whose caller's deadline passed, is still counted as a get that timed out.
func (p *inPlacePool) BatchView(ctx context.Context, keys []string) *pool.View {
	began := time.Now()
	v := p.v.BatchView(ctx, keys)
	p.countView(ctx, began, v)
	return v
}

// BatchViewDeferred leases without checking and counts the pages it did not offer as
// BatchView does; a page the caller's check later finds corrupt is counted then. A backend
// without deferred views checks here, and the view it returns has no Sums.
func (p *inPlacePool) BatchViewDeferred(ctx context.Context, keys []string) *pool.View {
	dv, ok := p.v.(pool.DeferredViewer)
	if !ok {
		return p.BatchView(ctx, keys)
	}
	began := time.Now()
	v := dv.BatchViewDeferred(ctx, keys)
	p.countView(ctx, began, v)
	v.OnCorrupt(p.corrupt)
	return v
}

// countView counts a view that began at began as the guard counts a get: a timeout when it ran
// past the pool timeout or its context's deadline passed, and the pages it did not offer.
func (p *inPlacePool) countView(ctx context.Context, began time.Time, v *pool.View) {
	if time.Since(began) > p.timeout {
		p.timeouts.Add(1)
		p.m.timeouts.WithLabelValues("get").Inc()
	} else {
		p.timedOut(ctx, "get")
	}
	bad := 0
	for _, n := range v.Codes {
		if n < 0 {
			bad++
		}
	}
	p.failed("get", &p.loadPages, bad)
}

// MemoryRegions is the backend's.
func (p *inPlacePool) MemoryRegions() [][]byte { return p.v.MemoryRegions() }

// BatchPutStart reserves within the timeout and counts the pages it could not reserve, as
// BatchPut counts dropped pages.
func (p *inPlacePool) BatchPutStart(ctx context.Context, keys []string, sizes []int64, cfg pool.ReplicateConfig) *pool.PutReservation {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	r := p.r.BatchPutStart(ctx, keys, sizes, cfg)
	p.timedOut(ctx, "put")
	bad := 0
	for _, c := range r.Codes {
		if c < 0 && c != pool.ErrObjectAlreadyExists {
			bad++
		}
	}
	p.failed("put", &p.droppedPages, bad)
	return r
}

var (
	_ pool.Viewer         = (*inPlacePool)(nil)
	_ pool.DeferredViewer = (*inPlacePool)(nil)
	_ pool.Reserver       = (*inPlacePool)(nil)
	_ pool.ReusingViewer  = (*reusingInPlacePool)(nil)
	_ pool.PieceCopier    = (*pieceInPlacePool)(nil)
	_ pool.PieceCopier    = (*pieceReusingInPlacePool)(nil)
	_ pool.ReusingViewer  = (*pieceReusingInPlacePool)(nil)
)
