package replay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/kvcache"
	"github.com/kvctl/kvctl/core/router"
)

// ErrUnreachable is wrapped by Live's error when the daemon cannot be reached.
var ErrUnreachable = errors.New("kvctl serve unreachable")

// LiveOptions configures a live replay.
type LiveOptions struct {
	// Socket is the engine socket of a running kvctl serve.
	Socket string
	// Engines is the number of simulated engines (attention-DP ranks) driving it.
	Engines int
	// AsFastAsPossible dispatches every request at once; otherwise at the trace's arrival times
	// divided by Speed.
	AsFastAsPossible bool
	Speed            float64
}

// LiveInfo is what a live replay measured.
type LiveInfo struct {
	Socket            string  `json:"socket"`
	Engines           int     `json:"engines"`
	Pace              string  `json:"pace"`
	WallSec           float64 `json:"wall_seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	P50RequestSec     float64 `json:"p50_request_seconds"`
	P99RequestSec     float64 `json:"p99_request_seconds"`
}

// liveEngine is one simulated engine: a KV cache manager, host memory registered with the
// daemon, and the connector calls of the engine API in the order the offline replay makes them
// in process.
type liveEngine struct {
	idx    int
	name   string
	cl     *engineapi.Client
	mem    *hostmem.SharedMemory
	mgr    *kvcache.Manager
	pages  []int32
	saving []string
	buf64  []int64
	buf32  []int32
	run    RunReport // this engine's counts, merged at the end
	rl     RankLoad
	lat    []float64
}

// Live replays the trace against a running kvctl serve at lo.Socket. The daemon's connector and
// pool run with the daemon's configuration, overridden by what an engine may set at Register
// (c's soft pin TTL, block groups, local reuse backoff, transfer batch); the local KV cache and
// the routing are c's. Pool, hole and eviction figures stay with the daemon (its admin API and
// metrics); the report has hits, tokens, loaded and offered save pages, and throughput.
func Live(ctx context.Context, t *Trace, p Params, c Config, lo LiveOptions) (*Report, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if lo.Engines < 1 {
		return nil, fmt.Errorf("live replay needs at least one engine, got %d", lo.Engines)
	}
	if !(lo.Speed > 0) {
		lo.Speed = 1
	}
	c.Ranks = lo.Engines
	maxBlocks := 1
	for _, r := range t.Requests {
		maxBlocks = max(maxBlocks, blocksOf(t.Format, r, p.TokensPerBlock))
	}
	engines := make([]*liveEngine, lo.Engines)
	defer func() {
		for _, e := range engines {
			if e != nil {
				e.close()
			}
		}
	}()
	for i := range engines {
		e, err := newLiveEngine(ctx, i, p, c, lo, maxBlocks)
		if err != nil {
			return nil, err
		}
		engines[i] = e
	}
	rt, err := router.New(router.Config{Policy: c.Router, Ranks: lo.Engines, MaxActiveRequests: p.MaxActiveRequests})
	if err != nil {
		return nil, err
	}
	var rmu sync.Mutex

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	queues := make([]chan int, lo.Engines)
	for i := range queues {
		queues[i] = make(chan int, 64)
	}
	errs := make(chan error, lo.Engines+1)
	var done sync.WaitGroup
	var progressMu sync.Mutex
	served := 0
	began := time.Now()
	for i, e := range engines {
		done.Add(1)
		go func() {
			defer done.Done()
			for k := range queues[i] {
				q := t.Requests[k]
				reqBegan := time.Now()
				if err := e.serve(ctx, t.Format, p, k, q); err != nil {
					errs <- fmt.Errorf("engine %d: request %s: %w", e.idx, q.ID, err)
					cancel()
					for range queues[i] {
					}
					return
				}
				e.lat = append(e.lat, time.Since(reqBegan).Seconds())
				rmu.Lock()
				_ = rt.Finished(q.ID)
				rmu.Unlock()
				if p.Progress != nil {
					progressMu.Lock()
					served++
					p.Progress(served, len(t.Requests))
					progressMu.Unlock()
				}
			}
			if err := e.drain(ctx); err != nil {
				errs <- fmt.Errorf("engine %d: %w", e.idx, err)
			}
		}()
	}

dispatch:
	for k, q := range t.Requests {
		if !lo.AsFastAsPossible {
			due := began.Add(time.Duration(float64(q.Arrival) / lo.Speed))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					break dispatch
				}
			}
		}
		rmu.Lock()
		pl, err := rt.Route([]router.Request{{ID: q.ID, ConversationID: q.ConversationID, PromptTokens: q.InputLength, Rank: router.Unplaced}})
		for err == nil && pl[0].Rank == router.Unplaced {
			// Every engine is at the cap: wait for one to finish a request.
			rmu.Unlock()
			time.Sleep(200 * time.Microsecond)
			rmu.Lock()
			pl, err = rt.Route([]router.Request{{ID: q.ID, ConversationID: q.ConversationID, PromptTokens: q.InputLength, Rank: router.Unplaced}})
		}
		rmu.Unlock()
		if err != nil {
			errs <- err
			cancel()
			break
		}
		engines[pl[0].Rank].rl.EstimatedTokens += int64(pl[0].Estimate)
		select {
		case queues[pl[0].Rank] <- k:
		case <-ctx.Done():
			break dispatch
		}
	}
	for _, q := range queues {
		close(q)
	}
	done.Wait()
	wall := time.Since(began)
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if len(all) > 0 {
		return nil, errors.Join(all...)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	rep := &Report{Mode: "live", Trace: Describe(t, p), Params: p.info()}
	run := RunReport{Name: c.Name, Settings: c.Settings, Ranks: lo.Engines, Router: c.Router}
	if run.Settings == nil {
		run.Settings = []Setting{}
	}
	var lat []float64
	for _, e := range engines {
		run.Requests += e.run.Requests
		run.FailedRequests += e.run.FailedRequests
		run.FailedLoads += e.run.FailedLoads
		run.Tokens.Input += e.run.Tokens.Input
		run.Tokens.LocalHit += e.run.Tokens.LocalHit
		run.Tokens.PoolHit += e.run.Tokens.PoolHit
		run.Tokens.Recomputed += e.run.Tokens.Recomputed
		run.Blocks.Input += e.run.Blocks.Input
		run.Blocks.LocalHit += e.run.Blocks.LocalHit
		run.Blocks.PoolHit += e.run.Blocks.PoolHit
		run.Moved.LoadedPages += e.run.Moved.LoadedPages
		run.Moved.SavedPages += e.run.Moved.SavedPages
		run.RankLoad = append(run.RankLoad, e.rl)
		lat = append(lat, e.lat...)
	}
	// Live, these are the bytes the daemon really moved: pages of the engines' registered size.
	run.Moved.LoadedBytes = run.Moved.LoadedPages * int64(p.SimPageBytes)
	run.Moved.SavedBytes = run.Moved.SavedPages * int64(p.SimPageBytes)
	if in := float64(run.Tokens.Input); in > 0 {
		run.HitRate = HitRates{
			Local: float64(run.Tokens.LocalHit) / in, Pool: float64(run.Tokens.PoolHit) / in,
			Total: float64(run.Tokens.LocalHit+run.Tokens.PoolHit) / in,
		}
	}
	run.Balance = balance(run.RankLoad)
	run.Wall = WallTimes{TotalSec: wall.Seconds()}
	rep.Runs = []RunReport{run}
	slices.Sort(lat)
	pace := "trace"
	if lo.AsFastAsPossible {
		pace = "max"
	}
	rep.Live = &LiveInfo{
		Socket: lo.Socket, Engines: lo.Engines, Pace: pace, WallSec: wall.Seconds(),
		RequestsPerSecond: float64(run.Requests) / wall.Seconds(),
		P50RequestSec:     quantile(lat, 0.5), P99RequestSec: quantile(lat, 0.99),
	}
	return rep, nil
}

func unreachable(err error) error {
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return fmt.Errorf("%w: %v", ErrUnreachable, s.Message())
	}
	return err
}

func newLiveEngine(ctx context.Context, i int, p Params, c Config, lo LiveOptions, slots int) (*liveEngine, error) {
	e := &liveEngine{idx: i, name: fmt.Sprintf("replay-%d-%d", os.Getpid(), i), rl: RankLoad{Rank: i}}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	var err error
	if e.cl, err = engineapi.Dial(lo.Socket); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	size := int64(slots) * int64(p.SimPageBytes)
	if e.mem, err = hostmem.NewSharedMemory(size); err != nil {
		return nil, err
	}
	// The daemon receives its own copy of the descriptor; the memory stays with e.mem.
	layout := &enginepb.Layout{TokensPerBlock: int32(p.TokensPerBlock), Groups: []*enginepb.LayerGroup{{
		Id: 0, Slots: int32(slots),
		Regions: []*enginepb.Region{{Offset: 0, Stride: uint64(p.SimPageBytes), Size: uint64(p.SimPageBytes)}},
	}}}
	req := &enginepb.RegisterRequest{
		Engine: e.name, ModelKey: "replay", WorldSize: 1, Rank: 0, AttentionDp: lo.Engines > 1,
		Role: "both", Format: "trtllm", Scheduler: true, Layout: layout,
		TransferBatchSize: int32(c.TransferBatchSize), SoftPinTtlMs: uint64(c.SoftPinTTL / time.Millisecond),
		GroupBlocks: c.GroupBlocks, LocalReuseBackoff: string(c.LocalReuseBackoff),
	}
	resp, err := e.cl.RegisterSharedMemory(ctx, req, e.mem.FD, uint64(size))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		return nil, fmt.Errorf("register engine %s: %w", e.name, unreachable(err))
	}
	d := resp.GetDeclarations()
	b := func(name string) *bool { v := d[name]; return &v }
	decl := &kvcache.Declarations{
		SupportsAttentionDP:           b("supports_attention_dp"),
		RequiresBlockAlignedReuse:     b("requires_block_aligned_reuse"),
		DropsReuseMatchBackoff:        b("drops_reuse_match_backoff"),
		ReportsFailedLoads:            b("reports_failed_loads"),
		SupportsSpeculativePrefill:    b("supports_speculative_prefill"),
		RequiresCompletionReservation: b("requires_completion_reservation"),
		SupportsAdmissionQuery:        b("supports_admission_query"),
	}
	kc := kvcache.Config{
		TokensPerBlock: p.TokensPerBlock, Pools: []kvcache.PoolConfig{{Group: "0", GPUSlots: c.GPUBlocks}},
		ReuseMatchBackoff: c.DraftLookahead, DraftPromptLookahead: c.DraftLookahead,
	}
	if e.mgr, err = kvcache.New(kc, decl, kvcache.Options{AttentionDP: lo.Engines > 1}); err != nil {
		return nil, err
	}
	e.pages = make([]int32, slots)
	for k := range e.pages {
		e.pages[k] = int32(k)
	}
	e.buf64 = make([]int64, 0, slots*p.TokensPerBlock)
	e.buf32 = make([]int32, 0, slots*p.TokensPerBlock)
	ok = true
	return e, nil
}

func (e *liveEngine) close() {
	if e.cl != nil {
		_, _ = e.cl.Unregister(context.Background(), &enginepb.EngineRef{Engine: e.name})
		_ = e.cl.Close()
	}
	if e.mem != nil {
		_ = e.mem.Close()
	}
	if e.mgr != nil {
		e.mgr.Shutdown()
	}
}

// drain waits until the daemon reports the saves of every finished request done.
func (e *liveEngine) drain(ctx context.Context) error {
	gen := e.saving
	left := len(e.saving)
	for left > 0 {
		r, err := e.cl.GetFinished(ctx, &enginepb.GetFinishedRequest{Engine: e.name, FinishedGen: gen})
		if err != nil {
			return unreachable(err)
		}
		gen = nil
		left -= len(r.GetFinishedSaving())
		if left > 0 {
			select {
			case <-time.After(100 * time.Microsecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	e.saving = e.saving[:0]
	return nil
}

func (e *liveEngine) tokens(format string, seed uint64, T int, q Request, pr prepared) ([]int64, []int32) {
	e.buf64, e.buf32 = e.buf64[:0], e.buf32[:0]
	if format != FormatMooncake {
		mask := scopeMask(q.Scope)
		for _, v := range q.Tokens {
			e.buf64 = append(e.buf64, v)
			e.buf32 = append(e.buf32, int32(v)^mask)
		}
		return e.buf64, e.buf32
	}
	for b, h := range q.HashIDs {
		n := T
		if b == len(q.HashIDs)-1 {
			n = pr.tailSynth
		}
		for i := range n {
			v := synthToken(seed, h, i)
			e.buf64 = append(e.buf64, v)
			e.buf32 = append(e.buf32, int32(v))
		}
	}
	return e.buf64, e.buf32
}

// serve runs request q (trace position k) on this engine through the daemon.
func (e *liveEngine) serve(ctx context.Context, format string, p Params, k int, q Request) error {
	T := p.TokensPerBlock
	pr := prepare(format, q, T)
	t64, t32 := e.tokens(format, p.Seed, T, q, pr)
	mid := kvcache.RequestID(k + 1)
	e.run.Requests++
	ref := &enginepb.EngineRef{Engine: e.name}
	var local, fromPool, loaded, offeredSaves int
	served := false
	for attempt := 0; attempt < 3 && !served; attempt++ {
		ar, err := e.mgr.Allocate(mid, t32, len(t32))
		if err != nil {
			if errors.Is(err, kvcache.ErrOutOfPages) {
				break
			}
			return err
		}
		local = ar.ReusedTokens
		// Saves of this engine's earlier requests must land before it looks the pool up, as
		// they would in process.
		if err := e.drain(ctx); err != nil {
			return err
		}
		lreq := &enginepb.Request{Id: q.ID, TokensPacked: engineapi.TokensView(t64), CacheSalt: q.Scope.CacheSalt, LoraTaskId: q.Scope.LoRATaskID, ContextOnly: true}
		lr, err := e.cl.Lookup(ctx, &enginepb.LookupRequest{Engine: e.name, Request: lreq, NumComputedTokens: int32(local)})
		if err != nil {
			return unreachable(err)
		}
		m := int(lr.GetMatchedTokens())
		ids := &enginepb.BlockIDs{Ids: e.pages[:pr.blocks]}
		if _, err := e.cl.UpdateStateAfterAlloc(ctx, &enginepb.AllocRequest{Engine: e.name, RequestId: q.ID, BlockIdsByGroup: []*enginepb.BlockIDs{ids}, HonouredTokens: int32(m)}); err != nil {
			return unreachable(err)
		}
		sub, err := e.cl.TakeSubmittedSaves(ctx, ref)
		if err != nil {
			return unreachable(err)
		}
		meta, err := e.cl.BuildMeta(ctx, &enginepb.BuildMetaRequest{Engine: e.name, SubmittedSaves: sub.GetIds(), NewRequests: []*enginepb.RequestData{{
			Id: q.ID, NewBlockIdsByGroup: []*enginepb.BlockIDs{ids}, ComputedPosition: int32(local), NumScheduledTokens: int32(len(t32) - local - m),
		}}})
		if err != nil {
			return unreachable(err)
		}
		if _, err := e.cl.BindMeta(ctx, &enginepb.BindMetaRequest{Engine: e.name, Metadata: meta}); err != nil {
			return unreachable(err)
		}
		if _, err := e.cl.StartLoad(ctx, ref); err != nil {
			return unreachable(err)
		}
		failed, err := e.cl.TakeFailedLoads(ctx, ref)
		if err != nil {
			return unreachable(err)
		}
		if slices.Contains(failed.GetIds(), q.ID) {
			e.run.FailedLoads++
			if _, err := e.cl.RequestReset(ctx, &enginepb.RequestRef{Engine: e.name, RequestId: q.ID}); err != nil {
				return unreachable(err)
			}
			if err := e.mgr.Revert(mid); err != nil {
				return err
			}
			continue
		}
		loaded, offeredSaves = 0, 0
		for _, l := range meta.GetLoads() {
			loaded += len(l.GetPages())
		}
		for _, s := range meta.GetSaves() {
			offeredSaves += len(s.GetPages())
		}
		fromPool = m
		if _, err := e.cl.WaitForSave(ctx, ref); err != nil {
			return unreachable(err)
		}
		fin, err := e.cl.RequestFinished(ctx, &enginepb.RequestRef{Engine: e.name, RequestId: q.ID})
		if err != nil {
			return unreachable(err)
		}
		if fin.GetAsyncSaving() {
			e.saving = append(e.saving, q.ID)
		}
		if err := e.mgr.Commit(mid, t32); err != nil {
			return err
		}
		if err := e.mgr.Free(mid); err != nil {
			return err
		}
		served = true
	}
	if !served {
		e.run.FailedRequests++
		local, fromPool = 0, 0
	}
	in := int64(q.InputLength)
	localReal := pr.realTokens(format, local, T)
	totalReal := pr.realTokens(format, local+fromPool, T)
	e.run.Tokens.Input += in
	e.run.Tokens.LocalHit += localReal
	e.run.Tokens.PoolHit += totalReal - localReal
	e.run.Tokens.Recomputed += in - totalReal
	e.run.Blocks.Input += int64(pr.blocks)
	e.run.Blocks.LocalHit += int64(local / T)
	e.run.Blocks.PoolHit += int64((local+fromPool)/T - local/T)
	e.run.Moved.LoadedPages += int64(loaded)
	e.run.Moved.SavedPages += int64(offeredSaves)
	e.rl.Requests++
	e.rl.InputTokens += in
	e.rl.RecomputedTokens += in - totalReal
	return nil
}
