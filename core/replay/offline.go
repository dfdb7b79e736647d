package replay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/kvcache"
	"github.com/kvctl/kvctl/core/router"
	"github.com/kvctl/kvctl/pool/embedded"
)

// Offline replays the trace under every configuration in virtual time and returns the report.
func Offline(ctx context.Context, t *Trace, p Params, cfgs []Config) (*Report, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if len(cfgs) == 0 {
		cfgs = []Config{DefaultConfig()}
	}
	rep := &Report{Mode: "offline", Trace: Describe(t, p), Params: p.info()}
	total := len(t.Requests) * len(cfgs)
	done := 0
	for _, c := range cfgs {
		progress := func(n int) {
			if p.Progress != nil {
				p.Progress(done+n, total)
			}
		}
		run, err := runOffline(ctx, t, p, c, progress)
		if err != nil {
			return nil, fmt.Errorf("configuration %s: %w", c.Name, err)
		}
		done += len(t.Requests)
		rep.Runs = append(rep.Runs, run)
	}
	return rep, nil
}

// epoch is the virtual time origin of every replay.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type offline struct {
	ctx    context.Context
	t      *Trace
	p      Params
	c      Config
	clock  *embedded.ManualClock
	emb    *embedded.Embedded
	pool   *countingPool
	ranks  []*rank
	router *router.Router
	ev     events
	seq    int
	now    time.Duration // virtual time of the pool clock since epoch
	tick   time.Duration // next eviction tick

	run   RunReport
	ttfts []float64
	buf64 []int64

	evictRounds, evicted atomic.Int64
	peakUsed             int64
	bucket               int
	bucketAcc            struct{ in, local, pool int64 }
	bucketN              int
	wall                 struct{ lookup, alloc, load, save, evict time.Duration }
}

func runOffline(ctx context.Context, t *Trace, p Params, c Config, progress func(int)) (RunReport, error) {
	o := &offline{ctx: ctx, t: t, p: p, c: c}
	began := time.Now()
	defer o.close()
	if err := o.setup(); err != nil {
		return RunReport{}, err
	}
	if err := o.replay(progress); err != nil {
		return RunReport{}, err
	}
	if err := o.finish(); err != nil {
		return RunReport{}, err
	}
	o.run.Wall.TotalSec = time.Since(began).Seconds()
	return o.run, nil
}

func (o *offline) close() {
	for _, r := range o.ranks {
		r.close()
	}
	if o.emb != nil {
		_ = o.emb.Close()
	}
}

func (o *offline) setup() error {
	p, c, t := o.p, o.c, o.t
	logger := p.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	maxBlocks, totalBlocks := 1, 0
	for _, r := range t.Requests {
		n := blocksOf(t.Format, r, p.TokensPerBlock)
		maxBlocks = max(maxBlocks, n)
		totalBlocks += n
	}
	o.buf64 = make([]int64, 0, maxBlocks*p.TokensPerBlock)

	o.clock = embedded.NewManualClock(epoch)
	po := embedded.DefaultOptions()
	po.Clock = o.clock
	po.EvictionPeriod = 0
	po.LeaseTTL = c.LeaseTTL
	po.EvictionRatio = c.EvictionRatio
	po.HighWatermark = c.HighWatermark
	po.AllowEvictSoftPinned = c.AllowEvictSoftPinned
	po.ExistRenewsLease = c.ExistRenewsLease
	var capacity int64
	if c.PoolBytes > 0 {
		pages := c.PoolBytes / p.PageBytes
		if pages < 1 {
			return fmt.Errorf("pool size %d B holds no page of %d B", c.PoolBytes, p.PageBytes)
		}
		capacity = pages * int64(p.SimPageBytes)
	} else {
		// Every block of the trace and a quarter more keeps an unlimited pool below any watermark
		// above 0.8.
		capacity = int64(totalBlocks+totalBlocks/4+64) * int64(p.SimPageBytes)
	}
	po.Segments = []embedded.SegmentSpec{{Name: "replay-0", Capacity: capacity}}
	if c.SoftPinTTL > po.MaxSoftPinTTL {
		po.MaxSoftPinTTL = c.SoftPinTTL
	}
	emb, err := embedded.NewEmbedded(po)
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	o.emb = emb
	emb.SetEvictionHook(func(r embedded.EvictionRound) {
		o.evictRounds.Add(1)
		o.evicted.Add(int64(len(r.Evicted)))
	})
	o.pool = &countingPool{Pool: emb, T: p.TokensPerBlock}
	for i := range c.Ranks {
		r, rerr := newRank(o, i, o.pool, maxBlocks, logger)
		if rerr != nil {
			return fmt.Errorf("rank %d: %w", i, rerr)
		}
		o.ranks = append(o.ranks, r)
	}
	o.router, err = router.New(router.Config{Policy: c.Router, Ranks: c.Ranks, MaxActiveRequests: p.MaxActiveRequests})
	if err != nil {
		return err
	}
	o.run = RunReport{
		Name: c.Name, Settings: c.Settings, Ranks: c.Ranks, Router: c.Router, PoolBytes: c.PoolBytes,
	}
	if c.Scheduler {
		o.run.Scheduler = &SchedulerCounts{}
	}
	if o.run.Settings == nil {
		o.run.Settings = []Setting{}
	}
	o.run.Pool.CapacityBytes = capacity / int64(p.SimPageBytes) * p.PageBytes
	o.tick = p.TickInterval
	return nil
}

func (o *offline) replay(progress func(int)) error {
	reqs := o.t.Requests
	span := time.Duration(1)
	if n := len(reqs); n > 0 && reqs[n-1].Arrival > 0 {
		span = reqs[n-1].Arrival
	}
	buckets := max(o.p.TimelineBuckets, 1)
	lastProgress := time.Now()
	for i := 0; i < len(reqs); {
		if err := o.ctx.Err(); err != nil {
			return err
		}
		j := i + 1
		for j < len(reqs) && reqs[j].Arrival == reqs[i].Arrival {
			j++
		}
		batch := reqs[i:j]
		at := batch[0].Arrival
		if o.c.Scheduler {
			if err := o.runPasses(at); err != nil {
				return err
			}
		}
		if err := o.drain(); err != nil {
			return err
		}
		if err := o.advance(at); err != nil {
			return err
		}
		if err := o.popEvents(at); err != nil {
			return err
		}
		placed, start, err := o.route(batch, at, i)
		if err != nil {
			return err
		}
		for k := range batch {
			b := int(int64(batch[k].Arrival) * int64(buckets) / int64(span))
			for b > o.bucket && o.bucket < buckets {
				if err := o.drain(); err != nil {
					return err
				}
				o.closeBucket(span, buckets)
			}
			if !o.c.Scheduler { // the scheduler model's requests were enqueued as they were placed
				if err := o.serve(i+k, batch[k], placed[k], start[k]); err != nil {
					return err
				}
			}
			if progress != nil && (time.Since(lastProgress) > 50*time.Millisecond || i+k+1 == len(reqs)) {
				progress(i + k + 1)
				lastProgress = time.Now()
			}
		}
		i = j
	}
	if o.c.Scheduler {
		if err := o.runPasses(math.MaxInt64); err != nil {
			return err
		}
	}
	if err := o.drain(); err != nil {
		return err
	}
	for o.bucket < buckets {
		o.closeBucket(span, buckets)
	}
	return nil
}

func (o *offline) closeBucket(span time.Duration, buckets int) {
	a := o.bucketAcc
	tp := TimePoint{
		AtSec:     (time.Duration(int64(span) * int64(o.bucket+1) / int64(buckets))).Seconds(),
		Requests:  o.bucketN,
		Occupancy: o.occupancy(),
	}
	if a.in > 0 {
		tp.LocalRate = float64(a.local) / float64(a.in)
		tp.PoolRate = float64(a.pool) / float64(a.in)
	}
	o.run.Timeline = append(o.run.Timeline, tp)
	o.bucketAcc = struct{ in, local, pool int64 }{}
	o.bucketN = 0
	o.bucket++
}

// serve replays request q (trace position i) on its rank.
func (o *offline) serve(i int, q Request, rk int, notBefore time.Duration) error {
	r := o.ranks[rk]
	pr := prepare(o.t.Format, q, o.p.TokensPerBlock)
	t64 := o.tokens(q, pr)
	o.run.Requests++
	// The saves of earlier requests land before this one looks the pool up, so that the pool
	// state it sees follows arrival order.
	if err := o.drain(); err != nil {
		return err
	}
	req := connector.Request{ID: q.ID, Tokens: t64, Scope: q.Scope, ContextOnly: true}
	s, err := r.eng.serve(o.ctx, req, kvcache.RequestID(i+1), pr.blocks)
	if err != nil {
		return err
	}
	o.run.FailedLoads += s.failedLoads
	if !s.ok {
		o.run.FailedRequests++
	}
	if s.saving {
		r.saving = append(r.saving, q.ID)
	}
	local, fromPool, loadedPages := s.local, s.fromPool, s.loadedPages

	computed := o.countHits(i, q, pr, local, fromPool, loadedPages)
	// Modelled time on the rank.
	pageBytes := float64(o.p.PageBytes)
	loadSec := float64(loadedPages) * pageBytes / o.p.LoadBandwidth
	prefillSec := float64(computed) / o.p.PrefillTokensPerSecond
	start := max(notBefore, q.Arrival, r.busy)
	ctxEnd := start + seconds(loadSec+prefillSec)
	r.busy = ctxEnd
	o.run.Time.LoadSec += loadSec
	o.run.Time.PrefillSec += prefillSec
	o.run.Time.QueueSec += (start - q.Arrival).Seconds()
	o.ttfts = append(o.ttfts, (ctxEnd - q.Arrival).Seconds())
	o.push(ctxEnd, q.ID, false)
	o.push(ctxEnd+seconds(float64(q.OutputLength)/o.p.DecodeTokensPerSecond), q.ID, true)

	r.load.Requests++
	r.load.InputTokens += int64(q.InputLength)
	r.load.RecomputedTokens += computed
	r.load.BusySec += loadSec + prefillSec
	return nil
}

// countHits records request q's (trace position i) hits and moves in the run's token, block
// and timeline counts, and returns the trace tokens it recomputed.
func (o *offline) countHits(i int, q Request, pr prepared, local, fromPool, loadedPages int) int64 {
	T := o.p.TokensPerBlock
	in := int64(q.InputLength)
	localReal := pr.realTokens(o.t.Format, local, T)
	totalReal := pr.realTokens(o.t.Format, local+fromPool, T)
	poolReal := totalReal - localReal
	computed := in - totalReal
	o.run.Tokens.Input += in
	o.run.Tokens.LocalHit += localReal
	o.run.Tokens.PoolHit += poolReal
	o.run.Tokens.Recomputed += computed
	o.run.Blocks.Input += int64(pr.blocks)
	o.run.Blocks.LocalHit += int64(local / T)
	o.run.Blocks.PoolHit += int64((local+fromPool)/T - local/T)
	o.run.Moved.LoadedPages += int64(loadedPages)
	if o.p.observe != nil {
		o.p.observe(i, (local+fromPool)/T)
	}
	o.bucketAcc.in += in
	o.bucketAcc.local += localReal
	o.bucketAcc.pool += poolReal
	o.bucketN++
	return computed
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
