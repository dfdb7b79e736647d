package replay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/kvcache"
)

// cacheEngine is one replay engine's side of the connector's Driver, offline and live alike:
// the engine's KV cache manager matches and allocates the prompt before the lookup (the local
// hit is the lookup's computed tokens), page slots are fixed (block b in slot b: an engine
// serves one request at a time), a failed load reverts the allocation and the request is tried
// again, up to maxAttempts admissions, and a computed prompt is committed to the local cache.
type cacheEngine struct {
	mgr   *kvcache.Manager
	drv   *connector.Driver
	slots []int
	// wait is called between rounds while the engine waits for its saves.
	wait func(context.Context) error
	// allocWall is the wall time spent in the manager's Allocate.
	allocWall time.Duration

	cur struct { // the request being served
		mid         kvcache.RequestID
		prompt      kvcache.Prompt
		blocks      int
		attempts    int
		local       int
		failedLoads int
	}
}

// maxAttempts bounds the admissions of a request whose loads keep failing.
const maxAttempts = 3

// served is what serving one request came to.
type served struct {
	ok          bool // its prompt was computed; false: it found no pages, or every load failed
	local       int  // replay tokens reused from the local cache
	fromPool    int  // replay tokens honoured from the pool and loaded
	loadedPages int
	savePages   int  // pages the metadata offered to save
	failedLoads int  // admissions whose load failed
	saving      bool // its saves are in flight
}

// managerDeclarations is what the KV cache manager reads of a connector's declarations.
func managerDeclarations(d connector.Declarations) *kvcache.Declarations {
	b := func(v bool) *bool { return &v }
	return &kvcache.Declarations{
		SupportsAttentionDP:           b(d.SupportsAttentionDP),
		RequiresBlockAlignedReuse:     b(d.RequiresBlockAlignedReuse),
		DropsReuseMatchBackoff:        b(d.DropsReuseMatchBackoff),
		ReportsFailedLoads:            b(d.ReportsFailedLoads),
		SupportsSpeculativePrefill:    b(d.SupportsSpeculativePrefill),
		RequiresCompletionReservation: b(d.RequiresCompletionReservation),
		SupportsAdmissionQuery:        b(d.SupportsAdmissionQuery),
	}
}

// cacheConfig is the local KV cache of every engine of a run under c.
func cacheConfig(p Params, c Config) kvcache.Config {
	return kvcache.Config{
		TokensPerBlock:       p.TokensPerBlock,
		Pools:                []kvcache.PoolConfig{{Group: "0", GPUSlots: c.GPUBlocks}},
		ReuseMatchBackoff:    c.DraftLookahead,
		DraftPromptLookahead: c.DraftLookahead,
		// Only a disaggregated server reserves completion headroom (seed commit 6).
		Disaggregated: c.Scheduler && c.Server != ServerAggregated,
	}
}

// newCacheEngine drives rank with the manager mgr over slots page slots of T-token blocks.
func newCacheEngine(rank connector.Rank, mgr *kvcache.Manager, T, slots int, wait func(context.Context) error) (*cacheEngine, error) {
	e := &cacheEngine{mgr: mgr, slots: make([]int, slots), wait: wait}
	for i := range e.slots {
		e.slots[i] = i
	}
	var err error
	e.drv, err = connector.NewDriver([]connector.Rank{rank}, connector.DriverOptions{TokensPerBlock: T, Hooks: connector.DriverHooks{
		Admit:     e.admit,
		Allocate:  e.allocate,
		Finished:  e.finished,
		Restarted: e.restarted,
	}})
	return e, err
}

func (e *cacheEngine) admit(_ context.Context, r *connector.DrivenRequest) (int, connector.Admission, error) {
	c := &e.cur
	if c.attempts == maxAttempts {
		return 0, connector.Drop, nil
	}
	c.attempts++
	began := time.Now()
	ar, err := e.mgr.Allocate(c.mid, c.prompt, len(c.prompt.Tokens))
	e.allocWall += time.Since(began)
	if errors.Is(err, kvcache.ErrOutOfPages) {
		return 0, connector.Drop, nil
	}
	if err != nil {
		return 0, connector.Drop, fmt.Errorf("request %s: allocate: %w", r.ID, err)
	}
	c.local = ar.ReusedTokens
	return c.local, connector.Admit, nil
}

func (e *cacheEngine) allocate(_ context.Context, r *connector.DrivenRequest, matched int, _ bool) (int, error) {
	r.Pages = [][]int{e.slots[:e.cur.blocks]}
	return matched, nil
}

func (e *cacheEngine) restarted(_ context.Context, _ *connector.DrivenRequest) error {
	e.cur.failedLoads++
	return e.mgr.Revert(e.cur.mid)
}

func (e *cacheEngine) finished(_ context.Context, r *connector.DrivenRequest) error {
	if err := e.mgr.Commit(e.cur.mid, e.cur.prompt.Tokens); err != nil {
		return fmt.Errorf("request %s: commit: %w", r.ID, err)
	}
	return e.mgr.Free(e.cur.mid)
}

// serve runs req, whose manager id is mid, over blocks replay blocks, until its prompt is
// computed or it is given up; its saves may still be in flight. The manager keys the prompt by
// the same tokens and scope as the connector.
func (e *cacheEngine) serve(ctx context.Context, req connector.Request, mid kvcache.RequestID, blocks int) (served, error) {
	e.cur.mid, e.cur.prompt, e.cur.blocks = mid, kvcache.Prompt{Tokens: req.Tokens, Scope: req.Scope}, blocks
	e.cur.attempts, e.cur.local, e.cur.failedLoads = 0, 0, 0
	r := e.drv.Add(req)
	for r.Phase == connector.PhaseWaiting || r.Phase == connector.PhaseRunning || r.Phase == connector.PhaseParked {
		if err := e.drv.Step(ctx); err != nil {
			return served{}, fmt.Errorf("request %s: %w", req.ID, err)
		}
		if r.Phase == connector.PhaseParked {
			if err := e.wait(ctx); err != nil {
				return served{}, err
			}
		}
	}
	out := served{failedLoads: e.cur.failedLoads}
	if r.Phase == connector.PhaseDropped {
		return out, nil
	}
	out.ok, out.local, out.fromPool = true, e.cur.local, r.Matched
	out.loadedPages, out.savePages, out.saving = r.LoadedPages, r.SavePages, r.AsyncSaving
	return out, nil
}

// drain waits until the saves of every request this engine served are done.
func (e *cacheEngine) drain(ctx context.Context) error {
	if !e.drv.Saving() {
		return nil
	}
	return e.drv.Drain(ctx, e.wait)
}
