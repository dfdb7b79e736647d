package daemon

import (
	"context"

	"github.com/kvctl/kvctl/core/statsapi"
	"github.com/kvctl/kvctl/mooncake"
)

// inPlacePool is the guarded pool for a backend whose memory is in this process (the embedded
// pool): it adds the backend's in-place calls (mooncake.Viewer, mooncake.Reserver), counted as
// the guard counts gets and puts, so the connectors register that memory with the GPU and copy
// pages straight between it and engine memory instead of through staging
// (docs/perf/serve-gpu.md).
type inPlacePool struct {
	*guardedPool
	v mooncake.Viewer
	r mooncake.Reserver
}

// connectorPool is the pool the daemon hands a connector: the guarded pool, with the in-place
// calls when the backend is the embedded pool and has them. A Mooncake backend keeps its values
// in segments reached over the Transfer Engine, so it always goes through staging.
func (d *Daemon) connectorPool() mooncake.Pool {
	if d.backend.Info.Kind != statsapi.BackendEmbedded {
		return d.pool
	}
	v, ok := d.backend.Pool.(mooncake.Viewer)
	if !ok {
		return d.pool
	}
	r, ok := d.backend.Pool.(mooncake.Reserver)
	if !ok {
		return d.pool
	}
	return &inPlacePool{guardedPool: d.guard, v: v, r: r}
}

// BatchView checks within the timeout and counts the pages it did not offer, as BatchGet.
func (p *inPlacePool) BatchView(ctx context.Context, keys []string) *mooncake.View {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	v := p.v.BatchView(ctx, keys)
	p.timedOut("get", ctx)
	bad := 0
	for _, n := range v.Codes {
		if n < 0 {
			bad++
		}
	}
	p.failed("get", &p.loadPages, bad)
	return v
}

// BatchViewDeferred leases without checking, within the timeout, and counts the pages it did
// not offer as BatchView does; a page the caller's check later finds corrupt is counted then.
// A backend without deferred views checks here, and the view it returns has no Sums.
func (p *inPlacePool) BatchViewDeferred(ctx context.Context, keys []string) *mooncake.View {
	dv, ok := p.v.(mooncake.DeferredViewer)
	if !ok {
		return p.BatchView(ctx, keys)
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	v := dv.BatchViewDeferred(ctx, keys)
	p.timedOut("get", ctx)
	bad := 0
	for _, n := range v.Codes {
		if n < 0 {
			bad++
		}
	}
	p.failed("get", &p.loadPages, bad)
	v.OnCorrupt(func() { p.failed("get", &p.loadPages, 1) })
	return v
}

// MemoryRegions is the backend's.
func (p *inPlacePool) MemoryRegions() [][]byte { return p.v.MemoryRegions() }

// BatchPutStart reserves within the timeout and counts the pages it could not reserve, as
// BatchPut counts dropped pages.
func (p *inPlacePool) BatchPutStart(ctx context.Context, keys []string, sizes []int64, cfg mooncake.ReplicateConfig) *mooncake.PutReservation {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	r := p.r.BatchPutStart(ctx, keys, sizes, cfg)
	p.timedOut("put", ctx)
	bad := 0
	for _, c := range r.Codes {
		if c < 0 && c != mooncake.ErrObjectAlreadyExists {
			bad++
		}
	}
	p.failed("put", &p.droppedPages, bad)
	return r
}

var (
	_ mooncake.Viewer         = (*inPlacePool)(nil)
	_ mooncake.DeferredViewer = (*inPlacePool)(nil)
	_ mooncake.Reserver       = (*inPlacePool)(nil)
)
