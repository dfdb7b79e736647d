package connector

import (
	"context"
	"fmt"

	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/gpu"
	"github.com/kvctl/kvctl/mooncake"
)

// pageIO is one pool value to move: its key, the engine page it belongs to and the index of
// the request that owns it.
type pageIO struct {
	req  int
	key  string
	ref  gpu.PageRef
	size int
}

// resolveLoads turns transfer lists into the page values to get: every page's sharded value
// and, for a group with replicated regions, its replicated value.
func (w *Worker) resolveLoads(ts []RequestTransfers) ([]pageIO, error) {
	g := w.geom
	T := w.opts.TokensPerBlock
	ns := w.opts.Namespace
	var out []pageIO
	for ri, t := range ts {
		for _, p := range t.Pages {
			if err := g.checkPage(p.Group, p.Page); err != nil {
				return nil, fmt.Errorf("request %s: %w", t.RequestID, err)
			}
			lg := g.groups[p.Group]
			out = append(out, pageIO{req: ri, key: ns.PageKey(p.Group, T, lg.BytesPerPage, p.Hash),
				ref: gpu.PageRef{Group: p.Group, Slot: p.Page}, size: int(lg.BytesPerPage)})
			if lg.ReplicatedBytesPerPage > 0 {
				out = append(out, pageIO{req: ri, key: ns.ReplicatedPageKey(p.Group, T, lg.ReplicatedBytesPerPage, p.Hash),
					ref: gpu.PageRef{Group: p.Group, Slot: p.Page, Replicated: true}, size: int(lg.ReplicatedBytesPerPage)})
			}
		}
	}
	return out, nil
}

// loadResult is what loadPages did.
type loadResult struct {
	failed       map[int]bool // request indices that lost a page
	failedPages  int
	firstMissing string
	landedBytes  int64
	storeCalls   int
}

// loadPages gets pages from the pool into staging slots, batch by batch, and scatters the
// slots that landed into engine memory. Once a request loses a page its remaining pages are
// not fetched. A result list of the wrong length fails every page of the batch. The returned
// error is for what is not a page miss (the mover, a cancelled context); page misses are in the
// result.
//
// With two or more staging slots, the slots are used as two sets so that the scatter of one
// batch overlaps the pool get of the next, as a GPU copy on a stream overlaps the host: unstage
// records issuing a scatter and sync the wait for it. At most one scatter is in flight (a Mover
// is not safe for concurrent use), a set is written again only after its scatter is done, and
// every scatter is done before loadPages returns, so no write into a failed request's pages is
// in flight when it is reported.
func loadPages(ctx context.Context, pool mooncake.Pool, mover gpu.Mover, stage gpu.Staging, batch int, items []pageIO, sample *stats.LoadSample) (res loadResult, err error) {
	res.failed = map[int]bool{}
	sets := 1
	if stage.Slots() >= 2 {
		sets = 2
	}
	batch = max(1, min(batch, stage.Slots()/sets))
	var inflight chan error // the scatter in flight, if any
	wait := func() error {
		if inflight == nil {
			return nil
		}
		m := sample.Start()
		err := <-inflight
		sample.End(stats.PhaseSync, m)
		inflight = nil
		if err != nil {
			return fmt.Errorf("scatter loaded pages: %w", err)
		}
		return nil
	}
	defer func() {
		if werr := wait(); err == nil {
			err = werr
		}
		if sample != nil {
			sample.LandedBytes += res.landedBytes
			sample.FailedPages += int64(res.failedPages)
		}
	}()
	set := 0
	for next := 0; next < len(items); {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		m := sample.Start()
		keys := make([]string, 0, batch)
		bufs := make([][]byte, 0, batch)
		owners := make([]*pageIO, 0, batch)
		for ; next < len(items) && len(keys) < batch; next++ {
			it := &items[next]
			if res.failed[it.req] {
				continue
			}
			keys = append(keys, it.key)
			bufs = append(bufs, stage.Slot(set*batch + len(bufs))[:it.size])
			owners = append(owners, it)
		}
		sample.End(stats.PhaseDescribe, m)
		if len(keys) == 0 {
			continue
		}

		m = sample.Start()
		got := pool.BatchGet(ctx, keys, bufs)
		sample.End(stats.PhaseGet, m)
		res.storeCalls++
		if sample != nil {
			sample.Pages += int64(len(keys))
			sample.StoreCalls++
		}

		srcs := make([][]byte, 0, len(keys))
		refs := make([]gpu.PageRef, 0, len(keys))
		for i, it := range owners {
			if len(got) == len(keys) && got[i] == int64(it.size) {
				srcs = append(srcs, bufs[i])
				refs = append(refs, it.ref)
				res.landedBytes += int64(it.size)
				continue
			}
			res.failedPages++
			if res.firstMissing == "" {
				res.firstMissing = it.key
			}
			res.failed[it.req] = true
		}
		if err := wait(); err != nil {
			return res, err
		}
		if len(srcs) > 0 {
			m = sample.Start()
			done := make(chan error, 1)
			go func() { done <- mover.Scatter(ctx, srcs, refs) }()
			inflight = done
			sample.End(stats.PhaseUnstage, m)
		}
		if sets == 2 {
			set ^= 1
		}
		if sets == 1 {
			if err := wait(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}
