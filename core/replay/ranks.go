package replay

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvcache"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/pool"
)

// rank is one attention-DP engine of an offline replay.
type rank struct {
	idx   int
	mgr   *kvcache.Manager
	sched *connector.Scheduler
	w     *connector.Worker
	// local is the rank's connector, the scheduler model's calls go through it; eng serves a
	// request at once (no scheduler model) through connector.Driver.
	local  connector.Rank
	eng    *cacheEngine
	mem    *hostmem.SharedMemory
	mover  kvmem.Mover
	pages  [][]int
	saving []string      // finished requests whose saves are not confirmed done
	busy   time.Duration // modelled: when the rank's prefill queue drains
	load   RankLoad
	// sch is the rank's scheduler model (--set scheduler=true); nil serves each request at once.
	sch *rankSched
	// queries reports admission-time connector queries in force on this rank.
	queries bool

	// The rank's asynchronous transfers in virtual time (asyncload.go): the gates armed for the
	// load being bound, the transfers queued on its load worker in start order, and when that
	// worker is next free.
	armed    []*loadGate
	queued   []*queuedLoad
	loadFree time.Duration
}

func (r *rank) close() {
	r.releaseLoads()
	if r.w != nil {
		_ = r.w.Close(context.Background())
	}
	if r.sched != nil {
		r.sched.Close()
	}
	if r.mover != nil {
		_ = r.mover.Close()
	}
	if r.mem != nil {
		_ = r.mem.Close()
	}
	if r.mgr != nil {
		r.mgr.Shutdown()
	}
}

func boolPtr(b bool) *bool { return &b }

// timedRank is a rank whose connector calls the offline replay times by phase, and whose
// lookups the counting pool folds into prefix-hole stats.
type timedRank struct {
	connector.Rank
	o *offline
}

func (t timedRank) Lookup(ctx context.Context, req connector.Request, numComputed int) (int, bool, error) {
	began := time.Now()
	t.o.pool.lookup = true
	m, async, err := t.Rank.Lookup(ctx, req, numComputed)
	t.o.pool.lookup = false
	t.o.wall.lookup += time.Since(began)
	return m, async, err
}

func (t timedRank) UpdateStateAfterAlloc(ctx context.Context, reqID string, pages [][]int, honoured int) error {
	began := time.Now()
	err := t.Rank.UpdateStateAfterAlloc(ctx, reqID, pages, honoured)
	t.o.wall.lookup += time.Since(began)
	return err
}

func (t timedRank) BuildMeta(ctx context.Context, out connector.SchedulerOutput) (connector.Metadata, error) {
	began := time.Now()
	m, err := t.Rank.BuildMeta(ctx, out)
	t.o.wall.lookup += time.Since(began)
	return m, err
}

func (t timedRank) BindMeta(ctx context.Context, meta connector.Metadata) error {
	began := time.Now()
	err := t.Rank.BindMeta(ctx, meta)
	t.o.wall.load += time.Since(began)
	return err
}

func (t timedRank) StartLoad(ctx context.Context) error {
	began := time.Now()
	err := t.Rank.StartLoad(ctx)
	t.o.wall.load += time.Since(began)
	return err
}

func newRank(o *offline, idx int, pl pool.Pool, slots int, logger *slog.Logger) (*rank, error) {
	p, c, clock := o.p, o.c, o.clock
	r := &rank{idx: idx, load: RankLoad{Rank: idx}}
	ok := false
	defer func() {
		if !ok {
			r.close()
		}
	}()
	T := p.TokensPerBlock
	layout := kvmem.Layout{TokensPerBlock: T, Groups: []kvmem.GroupLayout{{
		ID: 0, Slots: slots,
		Regions: []kvmem.Region{{Offset: 0, Stride: uint64(p.SimPageBytes), Size: uint64(p.SimPageBytes)}},
	}}}
	size := int64(slots) * int64(p.SimPageBytes)
	var err error
	if r.mem, err = hostmem.NewSharedMemory(size); err != nil {
		return nil, err
	}
	if r.mover, err = hostmem.NewMover(r.mem.FD, size, layout); err != nil {
		return nil, err
	}
	opts := connector.Options{
		Role:              connector.RoleBoth,
		Namespace:         keys.Namespace{ModelKey: "replay", WorldSize: 1, AttentionDP: c.Ranks > 1},
		Format:            keys.FormatTRTLLM,
		TokensPerBlock:    T,
		TransferBatchSize: c.TransferBatchSize,
		SoftPinTTL:        c.SoftPinTTL,
		GroupBlocks:       c.GroupBlocks,
		LocalReuseBackoff: c.LocalReuseBackoff,
		Logger:            logger,
		Clock:             clock.Now,
	}
	if c.Scheduler && c.AsyncLoad {
		// One load worker, held to each transfer's start in virtual time by its fence.
		opts.AsyncLoad, opts.AsyncLoadWorkers = true, 1
		opts.Fence = r.loadFence
	}
	if r.sched, err = connector.NewScheduler(opts, pl); err != nil {
		return nil, err
	}
	if err = r.sched.RegisterLayout(layout); err != nil {
		return nil, err
	}
	if r.w, err = connector.NewWorker(opts, pl, r.mover); err != nil {
		return nil, err
	}
	if err = r.w.RegisterLayout(layout); err != nil {
		return nil, err
	}
	r.local = connector.NewLocalRank(fmt.Sprintf("replay rank %d", idx), r.sched, r.w)
	decl := managerDeclarations(r.local.Declarations())
	kc := cacheConfig(p, c)
	if c.Scheduler {
		// The scheduler model's switches: the connector's requires_completion_reservation, and
		// kv_connector_config.admission_query.
		decl.RequiresCompletionReservation = boolPtr(c.CompletionReservation)
		if c.AdmissionQuery {
			kc.AdmissionQuery = &kvcache.AdmissionQueryConfig{MaxOfferDeferrals: c.MaxOfferDeferrals, MaxUnchargedParks: c.MaxUnchargedParks}
		}
	}
	if r.mgr, err = kvcache.New(kc, decl, kvcache.Options{AttentionDP: c.Ranks > 1}); err != nil {
		return nil, err
	}
	if c.Scheduler {
		r.sch = &rankSched{}
		r.queries = kvcache.AdmissionQueryApplies(kc, decl, c.Ranks > 1)
	}
	yield := func(context.Context) error { runtime.Gosched(); return nil }
	if r.eng, err = newCacheEngine(timedRank{Rank: r.local, o: o}, r.mgr, T, slots, yield); err != nil {
		return nil, err
	}
	ids := make([]int, slots)
	for i := range ids {
		ids[i] = i
	}
	r.pages = [][]int{ids}
	ok = true
	return r, nil
}
