package replay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/engineapi"
	"github.com/kvctl/kvctl/core/engineapi/enginepb"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvcache"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/core/router"
	"github.com/kvctl/kvctl/core/statsapi"
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
	// NoCallChannels keeps every engine's calls on its gRPC connection; by default each engine
	// calls over call channels (engineapi.Client.UseCallChannels), falling back to gRPC only
	// when the daemon has none (an older one answers Unimplemented).
	NoCallChannels bool
	// Admin is the daemon's admin address, which the pool-aware router asks which of a
	// request's keys the pool holds (as probe-pool does). The pool-aware router needs it.
	// Every live replay also reads the daemon's /v1/stats there before and after the run, to
	// say whether the daemon was ready and how many of its saves failed (LiveDaemon).
	Admin string
	// Warn, when set, is told at once when the daemon is not ready as the run starts, or when
	// its admin API cannot say.
	Warn func(msg string)
}

// ErrPoolAwareNeedsAdmin is returned by Live for the pool-aware router without an admin address.
var ErrPoolAwareNeedsAdmin = errors.New("the pool-aware router needs the daemon's admin address")

// liveLookupTimeout bounds one pool-aware lookup in a live replay; a lookup that fails or
// times out falls back to the work-aware estimate, as the disaggregated front's does.
const liveLookupTimeout = 200 * time.Millisecond

// LiveInfo is what a live replay measured.
type LiveInfo struct {
	Socket            string  `json:"socket"`
	Engines           int     `json:"engines"`
	Pace              string  `json:"pace"`
	WallSec           float64 `json:"wall_seconds"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	P50RequestSec     float64 `json:"p50_request_seconds"`
	P99RequestSec     float64 `json:"p99_request_seconds"`
	// PoolLookups and PoolLookupFallbacks count the pool-aware router's lookups of the daemon's
	// pool, and those that failed and fell back to the work-aware estimate.
	PoolLookups         int64 `json:"pool_lookups,omitempty"`
	PoolLookupFallbacks int64 `json:"pool_lookup_fallbacks,omitempty"`
	// Daemon is what the daemon's admin API said of the run.
	Daemon LiveDaemon `json:"daemon"`
}

// LiveDaemon is what a live replay read of the daemon's /v1/stats once its engines had
// registered and again once their saves were done: whether it was ready each time, and the
// save jobs it finished in between (those of every engine it serves, the replay's included).
// A daemon that is not ready answers every lookup miss and fails every save, so a run against
// it measures nothing of the pool.
type LiveDaemon struct {
	Admin string `json:"admin"`
	// Checked is true when the admin API answered both times and lists the replay's engines;
	// otherwise Error says why and nothing below is known.
	Checked bool   `json:"checked"`
	Error   string `json:"error,omitempty"`

	ReadyAtStart bool `json:"ready_at_start"`
	ReadyAtEnd   bool `json:"ready_at_end"`
	// UnreadyReason is the daemon's own words for the first unready answer.
	UnreadyReason string `json:"unready_reason,omitempty"`

	Saves           int64 `json:"saves"`
	FailedSaves     int64 `json:"failed_saves"`
	SavePages       int64 `json:"save_pages"`
	FailedSavePages int64 `json:"failed_save_pages"`
	// RefusedSavePages are pages the pool refused as invalid (counted in FailedSaves too).
	RefusedSavePages int64 `json:"refused_save_pages"`
	// NotJoinedSaves saved nothing because the daemon had not joined its Mooncake cluster yet:
	// not failures (another host may hold the pages), but not saved by this run either.
	NotJoinedSaves int64 `json:"not_joined_saves"`
}

// Problems lists what did not hold of the daemon during the run: not ready at its start or its
// end, saves that failed. Empty when the run measured the pool as configured, or when nothing
// could be checked (see Checked).
func (d LiveDaemon) Problems() []string {
	if !d.Checked {
		return nil
	}
	var out []string
	if !d.ReadyAtStart || !d.ReadyAtEnd {
		when := "when the replay started"
		switch {
		case !d.ReadyAtStart && !d.ReadyAtEnd:
			when = "when the replay started or ended"
		case !d.ReadyAtEnd:
			when = "when the replay ended"
		}
		why := ""
		if d.UnreadyReason != "" {
			why = " (" + d.UnreadyReason + ")"
		}
		out = append(out, "kvctl serve was not ready "+when+why)
	}
	if d.NotJoinedSaves > 0 {
		out = append(out, fmt.Sprintf("%d of %d saves were dropped before kvctl serve had joined its pool", d.NotJoinedSaves, d.Saves))
	}
	if d.FailedSaves > 0 {
		out = append(out, fmt.Sprintf("%d of %d saves failed (%d of %d pages not stored)", d.FailedSaves, d.Saves,
			d.FailedSavePages+d.RefusedSavePages, d.SavePages))
	}
	return out
}

// daemonWatch reads the daemon's /v1/stats around a live replay.
type daemonWatch struct {
	out    LiveDaemon
	target *probe.Target
	names  []string
	before statsapi.StatsJSON
}

// statsTimeout bounds one /v1/stats read of a live replay's daemon.
const statsTimeout = 5 * time.Second

// begin reads the daemon's stats once the engines named names have registered.
func (w *daemonWatch) begin(ctx context.Context, admin string, names []string) {
	w.out.Admin, w.names = admin, names
	if admin == "" {
		w.out.Error = "no admin address given"
		return
	}
	t, err := probe.NewTarget(admin, statsTimeout)
	if err != nil {
		w.out.Error = err.Error()
		return
	}
	w.target, w.out.Admin = t, t.Addr()
	s, err := w.read(ctx)
	if err != nil {
		w.out.Error, w.target = err.Error(), nil
		return
	}
	w.before, w.out.ReadyAtStart = s, s.Ready
	if !s.Ready {
		w.out.UnreadyReason = s.Backend.UnreadyReason
	}
}

// end reads the stats again once every save is done, and returns what the two reads say.
func (w *daemonWatch) end(ctx context.Context) LiveDaemon {
	if w.target == nil {
		return w.out
	}
	s, err := w.read(ctx)
	if err != nil {
		w.out.Error = err.Error()
		return w.out
	}
	w.out.Checked, w.out.ReadyAtEnd = true, s.Ready
	if !s.Ready && w.out.UnreadyReason == "" {
		w.out.UnreadyReason = s.Backend.UnreadyReason
	}
	b := w.before.Saves
	w.out.Saves, w.out.FailedSaves = s.Saves.Saves-b.Saves, s.Saves.FailedSaves-b.FailedSaves
	w.out.SavePages = s.Saves.Pages - b.Pages
	w.out.FailedSavePages, w.out.RefusedSavePages = s.Saves.FailedPages-b.FailedPages, s.Saves.RefusedPages-b.RefusedPages
	w.out.NotJoinedSaves = s.Saves.NotJoinedSaves - b.NotJoinedSaves
	return w.out
}

// read fetches /v1/stats and checks that it is the daemon the replay's engines registered with.
func (w *daemonWatch) read(ctx context.Context) (statsapi.StatsJSON, error) {
	s, err := w.target.ServeStats(ctx)
	if err != nil {
		return s, fmt.Errorf("reading the daemon's stats: %w", err)
	}
	registered := map[string]bool{}
	for _, e := range s.Engines {
		registered[e.Engine] = true
	}
	for _, n := range w.names {
		if !registered[n] {
			return s, fmt.Errorf("%s is another kvctl serve's admin address: engine %s of this replay is not registered there", w.target.Addr(), n)
		}
	}
	return s, nil
}

// liveEngine is one simulated engine: a KV cache manager, host memory registered with the
// daemon, and the offline replay's cacheEngine over an engineapi.RemoteRank, so the engine API
// sees the connector calls the offline replay makes in process, in the same order.
type liveEngine struct {
	idx   int
	name  string
	cl    *engineapi.Client
	mem   *hostmem.SharedMemory
	mgr   *kvcache.Manager
	eng   *cacheEngine // the connector calls, through the daemon
	buf64 []int64
	run   RunReport // this engine's counts, merged at the end
	rl    RankLoad
	lat   []float64
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
	// The pool-aware router's estimate comes from the daemon's pool, asked through its admin API
	// with the keys the engines' requests have.
	var poolFallbacks atomic.Int64
	routed := func(q Request) router.Request {
		return router.Request{ID: q.ID, ConversationID: q.ConversationID, PromptTokens: q.InputLength, Rank: router.Unplaced}
	}
	if c.Router == router.PolicyPoolAware {
		if lo.Admin == "" {
			return nil, fmt.Errorf("%w: give it with --admin", ErrPoolAwareNeedsAdmin)
		}
		target, err := probe.NewTarget(lo.Admin, liveLookupTimeout)
		if err != nil {
			return nil, fmt.Errorf("pool-aware router: %w", err)
		}
		exists := func(keys []string) ([]bool, error) {
			lctx, cancel := context.WithTimeout(ctx, liveLookupTimeout)
			defer cancel()
			return target.Exists(lctx, keys, false)
		}
		routed = func(q Request) router.Request {
			rq := router.Request{ID: q.ID, ConversationID: q.ConversationID, PromptTokens: q.InputLength, Rank: router.Unplaced}
			rq.PoolUncached, rq.PoolKnown = poolUncachedOf(t.Format, p, q, lo.Engines > 1, exists)
			if !rq.PoolKnown {
				poolFallbacks.Add(1)
			}
			return rq
		}
	}
	var rmu sync.Mutex

	var watch daemonWatch
	names := make([]string, len(engines))
	for i, e := range engines {
		names[i] = e.name
	}
	watch.begin(ctx, lo.Admin, names)
	if lo.Warn != nil {
		switch {
		case watch.target == nil:
			lo.Warn(fmt.Sprintf("cannot tell whether kvctl serve is ready or its saves succeed: %s; pass --admin with its admin address", watch.out.Error))
		case !watch.out.ReadyAtStart:
			lo.Warn(fmt.Sprintf("kvctl serve is not ready (%s): its lookups miss and its saves fail until it is", watch.out.UnreadyReason))
		}
	}

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
		rq := routed(q)
		rmu.Lock()
		pl, err := rt.Route([]router.Request{rq})
		for err == nil && pl[0].Rank == router.Unplaced {
			// Every engine is at the cap: wait for one to finish a request.
			rmu.Unlock()
			time.Sleep(200 * time.Microsecond)
			rmu.Lock()
			pl, err = rt.Route([]router.Request{rq})
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

	daemon := watch.end(ctx)
	if lo.Warn != nil && watch.target != nil && !daemon.Checked {
		lo.Warn(fmt.Sprintf("cannot tell whether kvctl serve's saves succeeded: %s", daemon.Error))
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
		Daemon: daemon,
	}
	if c.Router == router.PolicyPoolAware {
		rep.Live.PoolLookups, rep.Live.PoolLookupFallbacks = int64(run.Requests), poolFallbacks.Load()
	}
	return rep, nil
}

// unreachable is err, wrapping ErrUnreachable where it says the daemon is unavailable.
func unreachable(err error) error {
	if err == nil {
		return nil
	}
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
		Role: string(connector.RoleBoth), Format: string(keys.FormatTRTLLM), Scheduler: true, Layout: layout,
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
	if !lo.NoCallChannels {
		// A daemon without call channels answers Unimplemented; the calls then go over gRPC.
		if cerr := e.cl.UseCallChannels(ctx, 0); cerr != nil && status.Code(cerr) != codes.Unimplemented {
			return nil, fmt.Errorf("engine %s: %w", e.name, unreachable(cerr))
		}
	}
	rank := engineapi.NewRemoteRank(e.cl, resp, connector.RoleBoth)
	if e.mgr, err = kvcache.New(cacheConfig(p, c), managerDeclarations(rank.Declarations()), kvcache.Options{AttentionDP: lo.Engines > 1}); err != nil {
		return nil, err
	}
	wait := func(ctx context.Context) error {
		select {
		case <-time.After(100 * time.Microsecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if e.eng, err = newCacheEngine(rank, e.mgr, p.TokensPerBlock, slots, wait); err != nil {
		return nil, err
	}
	e.buf64 = make([]int64, 0, slots*p.TokensPerBlock)
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
func (e *liveEngine) drain(ctx context.Context) error { return unreachable(e.eng.drain(ctx)) }

// serve runs request q (trace position k) on this engine through the daemon.
func (e *liveEngine) serve(ctx context.Context, format string, p Params, k int, q Request) error {
	T := p.TokensPerBlock
	pr := prepare(format, q, T)
	e.buf64 = appendTokens(e.buf64[:0], format, p.Seed, T, q, pr)
	e.run.Requests++
	// Saves of this engine's earlier requests must land before it looks the pool up, as they
	// would in process.
	if err := e.drain(ctx); err != nil {
		return err
	}
	req := connector.Request{ID: q.ID, Tokens: e.buf64, Scope: q.Scope, ContextOnly: true}
	s, err := e.eng.serve(ctx, req, kvcache.RequestID(k+1), pr.blocks)
	if err != nil {
		return unreachable(err)
	}
	e.run.FailedLoads += s.failedLoads
	if !s.ok {
		e.run.FailedRequests++
	}
	in := int64(q.InputLength)
	localReal := pr.realTokens(format, s.local, T)
	totalReal := pr.realTokens(format, s.local+s.fromPool, T)
	e.run.Tokens.Input += in
	e.run.Tokens.LocalHit += localReal
	e.run.Tokens.PoolHit += totalReal - localReal
	e.run.Tokens.Recomputed += in - totalReal
	e.run.Blocks.Input += int64(pr.blocks)
	e.run.Blocks.LocalHit += int64(s.local / T)
	e.run.Blocks.PoolHit += int64((s.local+s.fromPool)/T - s.local/T)
	e.run.Moved.LoadedPages += int64(s.loadedPages)
	e.run.Moved.SavedPages += int64(s.savePages)
	e.rl.Requests++
	e.rl.InputTokens += in
	e.rl.RecomputedTokens += in - totalReal
	return nil
}
