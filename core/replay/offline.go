package replay

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/hostmem"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvcache"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/router"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/mooncake"
)

// Params are the run-wide replay parameters.
type Params struct {
	// TokensPerBlock is the replay block size: tokens synthesised per Mooncake trace block, or
	// the block size a token trace is keyed with.
	TokensPerBlock int
	// PageBytes is the real size of one block's page; SimPageBytes what offline pages hold.
	PageBytes    int64
	SimPageBytes int
	// LoadBandwidth and SaveBandwidth are bytes per second between an engine and the pool.
	LoadBandwidth float64
	SaveBandwidth float64
	// PrefillTokensPerSecond is a rank's prefill rate; DecodeTokensPerSecond a request's
	// decode rate.
	PrefillTokensPerSecond float64
	DecodeTokensPerSecond  float64
	// MaxActiveRequests caps a rank's requests for the router; 0 is no cap.
	MaxActiveRequests int
	// TickInterval is the pool eviction thread's period in virtual time.
	TickInterval time.Duration
	// Seed picks the synthesised token ids.
	Seed uint64
	// TimelineBuckets is the number of timeline intervals (for --plot).
	TimelineBuckets int
	// Progress, when set, is called with the requests replayed so far over all runs.
	Progress func(done, total int)
	// Logger receives the connector's lines; nil discards them.
	Logger *slog.Logger

	// observe, when set (tests), sees every request's trace index and whole hit blocks.
	observe func(i, hitBlocks int)
}

// DefaultParams returns the defaults: 16 tokens per replay block, 64 MiB real pages (512
// tokens of a Llama-3-8B-sized model in fp16) held as 64-byte pages, 25 GB/s each way, 50 000
// prefill tokens/s, 50 decode tokens/s, the master's 10 ms eviction tick.
func DefaultParams() Params {
	return Params{
		TokensPerBlock:         16,
		PageBytes:              64 << 20,
		SimPageBytes:           64,
		LoadBandwidth:          25e9,
		SaveBandwidth:          25e9,
		PrefillTokensPerSecond: 50000,
		DecodeTokensPerSecond:  50,
		TickInterval:           mooncake.DefaultEvictionPeriod,
		Seed:                   1,
		TimelineBuckets:        120,
	}
}

// Validate reports every problem with the parameters at once.
func (p Params) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if p.TokensPerBlock < 1 || p.TokensPerBlock > 1<<16 {
		bad("tokens per block %d: want 1 to 65536", p.TokensPerBlock)
	}
	if p.PageBytes < 1 {
		bad("page size %d: must be positive", p.PageBytes)
	}
	if p.SimPageBytes < 1 || p.SimPageBytes > 1<<20 {
		bad("simulated page size %d: want 1 to 1 MiB", p.SimPageBytes)
	}
	for name, v := range map[string]float64{"load bandwidth": p.LoadBandwidth, "save bandwidth": p.SaveBandwidth,
		"prefill rate": p.PrefillTokensPerSecond, "decode rate": p.DecodeTokensPerSecond} {
		if !(v > 0) || math.IsInf(v, 0) {
			bad("%s %v: must be positive and finite", name, v)
		}
	}
	if p.MaxActiveRequests < 0 {
		bad("max active requests %d is negative", p.MaxActiveRequests)
	}
	if p.TickInterval <= 0 {
		bad("eviction tick %v: must be positive", p.TickInterval)
	}
	slices.SortFunc(errs, func(a, b error) int {
		if a.Error() < b.Error() {
			return -1
		}
		return 1
	})
	return errors.Join(errs...)
}

func (p Params) info() ParamsInfo {
	return ParamsInfo{
		Seed: p.Seed, TraceBlockTokens: TraceBlockTokens, TokensPerBlock: p.TokensPerBlock,
		PageBytes: p.PageBytes, SimPageBytes: p.SimPageBytes,
		LoadBandwidth: p.LoadBandwidth, SaveBandwidth: p.SaveBandwidth,
		PrefillTokensPerSecond: p.PrefillTokensPerSecond, DecodeTokensPerSecond: p.DecodeTokensPerSecond,
		MaxActiveRequests: p.MaxActiveRequests, TickMs: float64(p.TickInterval) / float64(time.Millisecond),
	}
}

// Describe returns the trace summary a report starts with.
func Describe(t *Trace, p Params) TraceInfo {
	ti := TraceInfo{Name: t.Name, Format: t.Format, Requests: len(t.Requests), SkippedLines: t.Skipped}
	if ti.SkippedLines == nil {
		ti.SkippedLines = []LineError{}
	}
	for _, r := range t.Requests {
		ti.InputTokens += int64(r.InputLength)
		ti.OutputTokens += int64(r.OutputLength)
		ti.Blocks += int64(blocksOf(t.Format, r, p.TokensPerBlock))
	}
	if n := len(t.Requests); n > 0 {
		ti.DurationSec = t.Requests[n-1].Arrival.Seconds()
	}
	return ti
}

// blocksOf is the number of trace blocks of r: hash ids, or the replay blocks of a token
// trace (a partial tail counts).
func blocksOf(format string, r Request, T int) int {
	if format == FormatMooncake {
		return len(r.HashIDs)
	}
	return (len(r.Tokens) + T - 1) / T
}

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

// prepared is a request's replay shape.
type prepared struct {
	blocks    int // trace blocks
	tokens    int // replay tokens
	tailReal  int // trace tokens of the last block
	tailSynth int // replay tokens of the last block
}

func prepare(format string, r Request, T int) prepared {
	if format != FormatMooncake {
		n := (len(r.Tokens) + T - 1) / T
		return prepared{blocks: n, tokens: len(r.Tokens), tailReal: len(r.Tokens) - (n-1)*T, tailSynth: len(r.Tokens) - (n-1)*T}
	}
	n := len(r.HashIDs)
	tail := r.InputLength - (n-1)*TraceBlockTokens
	synth := T
	if tail < TraceBlockTokens {
		synth = (tail*T + TraceBlockTokens - 1) / TraceBlockTokens
		synth = max(1, min(synth, T-1))
		if T == 1 {
			synth = 1
		}
	}
	return prepared{blocks: n, tokens: (n-1)*T + synth, tailReal: tail, tailSynth: synth}
}

// realTokens converts a replay token count of a request's prefix into trace tokens.
func (pr prepared) realTokens(format string, synth, T int) int64 {
	if format != FormatMooncake {
		return int64(synth)
	}
	if synth >= pr.tokens {
		return int64((pr.blocks-1)*TraceBlockTokens + pr.tailReal)
	}
	full, rem := synth/T, synth%T
	real := full * TraceBlockTokens
	if rem > 0 {
		if full == pr.blocks-1 {
			real += rem * pr.tailReal / pr.tailSynth
		} else {
			real += rem * TraceBlockTokens / T
		}
	}
	return int64(real)
}

// synthToken is token i of the block with Mooncake hash id h.
func synthToken(seed uint64, h int64, i int) int64 {
	x := seed*0x9E3779B97F4A7C15 ^ uint64(h)*0xD1B54A32D192ED03 ^ uint64(i)*0xBF58476D1CE4E5B9
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return int64(x & 0x7fffffff)
}

// countingPool counts what the connector's workers write and read, and folds the existence
// answer of each scheduler lookup into prefix-hole stats exactly as the connector's own stats
// do (stats.FoldLookup over the same answer; the offline layout has one key per block), which
// spares the connector's stats reporter and its per-load thread-time syscalls.
type countingPool struct {
	mooncake.Pool
	putOK, putFailed, gotPages atomic.Int64
	saveNanos                  atomic.Int64

	// lookup is set by the replay loop around Scheduler.Lookup, when no save is in flight, so
	// the existence call it sees is the lookup's.
	lookup bool
	T      int
	holes  stats.HoleStats
}

func (c *countingPool) BatchIsExist(ctx context.Context, ks []string) []int {
	out := c.Pool.BatchIsExist(ctx, ks)
	if c.lookup {
		complete := make([]bool, len(ks))
		if len(out) == len(ks) {
			for i, v := range out {
				complete[i] = v == 1
			}
		}
		_, h := stats.FoldLookup(complete, c.T)
		c.holes.Add(h)
	}
	return out
}

func (c *countingPool) BatchPut(ctx context.Context, ks []string, bufs [][]byte, cfg mooncake.ReplicateConfig) []mooncake.Code {
	began := time.Now()
	codes := c.Pool.BatchPut(ctx, ks, bufs, cfg)
	c.saveNanos.Add(int64(time.Since(began)))
	for _, code := range codes {
		if code == mooncake.OK {
			c.putOK.Add(1)
		} else if code != mooncake.ErrObjectAlreadyExists {
			c.putFailed.Add(1)
		}
	}
	return codes
}

func (c *countingPool) BatchGet(ctx context.Context, ks []string, bufs [][]byte) []int64 {
	out := c.Pool.BatchGet(ctx, ks, bufs)
	for _, n := range out {
		if n > 0 {
			c.gotPages.Add(1)
		}
	}
	return out
}

// rank is one attention-DP engine of an offline replay.
type rank struct {
	idx    int
	mgr    *kvcache.Manager
	sched  *connector.Scheduler
	w      *connector.Worker
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
}

func (r *rank) close() {
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

func newRank(idx int, p Params, c Config, pool mooncake.Pool, clock *mooncake.ManualClock, slots int, logger *slog.Logger) (*rank, error) {
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
		opts.AsyncLoad, opts.AsyncLoadWorkers = true, 1
	}
	if r.sched, err = connector.NewScheduler(opts, pool); err != nil {
		return nil, err
	}
	if err := r.sched.RegisterLayout(layout); err != nil {
		return nil, err
	}
	if r.w, err = connector.NewWorker(opts, pool, r.mover); err != nil {
		return nil, err
	}
	if err := r.w.RegisterLayout(layout); err != nil {
		return nil, err
	}
	d := r.sched.Declarations()
	decl := &kvcache.Declarations{
		SupportsAttentionDP:           boolPtr(d.SupportsAttentionDP),
		RequiresBlockAlignedReuse:     boolPtr(d.RequiresBlockAlignedReuse),
		DropsReuseMatchBackoff:        boolPtr(d.DropsReuseMatchBackoff),
		ReportsFailedLoads:            boolPtr(d.ReportsFailedLoads),
		SupportsSpeculativePrefill:    boolPtr(d.SupportsSpeculativePrefill),
		RequiresCompletionReservation: boolPtr(d.RequiresCompletionReservation),
		SupportsAdmissionQuery:        boolPtr(d.SupportsAdmissionQuery),
	}
	kc := kvcache.Config{
		TokensPerBlock:       T,
		Pools:                []kvcache.PoolConfig{{Group: "0", GPUSlots: c.GPUBlocks}},
		ReuseMatchBackoff:    c.DraftLookahead,
		DraftPromptLookahead: c.DraftLookahead,
	}
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
	ids := make([]int, slots)
	for i := range ids {
		ids[i] = i
	}
	r.pages = [][]int{ids}
	ok = true
	return r, nil
}

// event is a modelled moment a router hears about: a request leaving the context phase or
// finishing.
type event struct {
	at       time.Duration
	seq      int
	id       string
	finished bool
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

// epoch is the virtual time origin of every replay.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type offline struct {
	ctx    context.Context
	t      *Trace
	p      Params
	c      Config
	clock  *mooncake.ManualClock
	emb    *mooncake.Embedded
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
	buf32 []int32

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
	o.buf32 = make([]int32, 0, maxBlocks*p.TokensPerBlock)

	o.clock = mooncake.NewManualClock(epoch)
	po := mooncake.DefaultOptions()
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
	po.Segments = []mooncake.SegmentSpec{{Name: "replay-0", Capacity: capacity}}
	if c.SoftPinTTL > po.MaxSoftPinTTL {
		po.MaxSoftPinTTL = c.SoftPinTTL
	}
	emb, err := mooncake.NewEmbedded(po)
	if err != nil {
		return fmt.Errorf("pool: %w", err)
	}
	o.emb = emb
	emb.SetEvictionHook(func(r mooncake.EvictionRound) {
		o.evictRounds.Add(1)
		o.evicted.Add(int64(len(r.Evicted)))
	})
	o.pool = &countingPool{Pool: emb, T: p.TokensPerBlock}
	for i := range c.Ranks {
		r, err := newRank(i, p, c, o.pool, o.clock, maxBlocks, logger)
		if err != nil {
			return fmt.Errorf("rank %d: %w", i, err)
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

// advance moves the pool clock to at, running the eviction thread's ticks on the way. A tick
// that does not fire means none will until the next put, so the clock jumps to at.
func (o *offline) advance(at time.Duration) {
	if at <= o.now {
		return
	}
	began := time.Now()
	for o.tick <= at {
		o.clock.Advance(o.tick - o.now)
		o.now = o.tick
		o.tick += o.p.TickInterval
		if _, ran := o.emb.EvictNow(); !ran {
			o.tick = (at/o.p.TickInterval + 1) * o.p.TickInterval
			break
		}
	}
	o.clock.Advance(at - o.now)
	o.now = at
	o.wall.evict += time.Since(began)
}

// popEvents applies the router events due by at.
func (o *offline) popEvents(at time.Duration) error {
	for len(o.ev) > 0 && o.ev[0].at <= at {
		e := heap.Pop(&o.ev).(event)
		var err error
		if e.finished {
			err = o.router.Finished(e.id)
		} else {
			err = o.router.ContextDone(e.id)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (o *offline) push(at time.Duration, id string, finished bool) {
	o.seq++
	heap.Push(&o.ev, event{at: at, seq: o.seq, id: id, finished: finished})
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
		o.advance(at)
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

func (o *offline) usedBytes() int64 {
	segs, err := o.emb.Segments(context.Background())
	if err != nil {
		return 0
	}
	var used int64
	for _, s := range segs {
		used += s.Used
	}
	return used
}

func (o *offline) occupancy() float64 {
	capBytes := int64(0)
	segs, err := o.emb.Segments(context.Background())
	if err != nil {
		return 0
	}
	var used int64
	for _, s := range segs {
		capBytes += s.Capacity
		used += s.Used
	}
	if capBytes == 0 {
		return 0
	}
	return float64(used) / float64(capBytes)
}

// route places a batch, waiting for modelled finishes while a capped router cannot place a
// request; it returns each request's rank and the earliest modelled start.
//
// Under the scheduler model a placed request is handed to its rank at once (first is the
// batch's trace position), so that the passes a capped router waits on can run it.
func (o *offline) route(batch []Request, at time.Duration, first int) ([]int, []time.Duration, error) {
	ranks := make([]int, len(batch))
	starts := make([]time.Duration, len(batch))
	todo := make([]int, len(batch))
	for k := range todo {
		todo[k] = k
	}
	when := at
	for len(todo) > 0 {
		rq := make([]router.Request, len(todo))
		for n, k := range todo {
			rq[n] = o.routerRequest(batch[k])
		}
		pl, err := o.router.Route(rq)
		if err != nil {
			return nil, nil, err
		}
		var left []int
		for n, k := range todo {
			if pl[n].Rank == router.Unplaced {
				left = append(left, k)
				continue
			}
			ranks[k], starts[k] = pl[n].Rank, when
			if o.c.Scheduler {
				o.enqueue(first+k, batch[k], pl[n].Rank, when)
			}
			o.ranks[pl[n].Rank].load.EstimatedTokens += int64(pl[n].Estimate)
		}
		todo = left
		if len(todo) == 0 {
			break
		}
		if len(o.ev) == 0 && o.c.Scheduler {
			if _, err := o.runUntilEvent(); err != nil {
				return nil, nil, err
			}
		}
		if len(o.ev) == 0 {
			return nil, nil, fmt.Errorf("%d requests cannot be placed and no request is running", len(todo))
		}
		// Wait for the next modelled event to free a slot.
		next := o.ev[0].at
		if err := o.popEvents(next); err != nil {
			return nil, nil, err
		}
		when = max(when, next)
	}
	return ranks, starts, nil
}

func (o *offline) tokens(q Request, pr prepared) ([]int64, []int32) {
	o.buf64, o.buf32 = o.buf64[:0], o.buf32[:0]
	if o.t.Format != FormatMooncake {
		// The KV cache manager keys blocks by tokens alone; a scope mask keeps requests of
		// different cache salts or LoRA adapters from sharing local blocks, as their pool keys
		// already are kept apart by the connector.
		mask := scopeMask(q.Scope)
		for _, v := range q.Tokens {
			o.buf64 = append(o.buf64, v)
			o.buf32 = append(o.buf32, int32(v)^mask)
		}
		return o.buf64, o.buf32
	}
	T := o.p.TokensPerBlock
	for b, h := range q.HashIDs {
		n := T
		if b == len(q.HashIDs)-1 {
			n = pr.tailSynth
		}
		for i := range n {
			v := synthToken(o.p.Seed, h, i)
			o.buf64 = append(o.buf64, v)
			o.buf32 = append(o.buf32, int32(v))
		}
	}
	return o.buf64, o.buf32
}

// scopeMask is 0 for requests without salt or LoRA adapter and a fixed positive mask per
// (salt, adapter) otherwise.
func scopeMask(s keys.Scope) int32 {
	salt := ""
	if s.CacheSalt != nil {
		salt = *s.CacheSalt
	}
	if salt == "" && s.LoRATaskID == nil {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(salt))
	if s.LoRATaskID != nil {
		fmt.Fprintf(h, "|lora=%d", *s.LoRATaskID)
	}
	return int32(h.Sum64()&0x7fffffff) | 1
}

// serve replays request q (trace position i) on its rank.
func (o *offline) serve(i int, q Request, rk int, notBefore time.Duration) error {
	r := o.ranks[rk]
	T := o.p.TokensPerBlock
	pr := prepare(o.t.Format, q, T)
	t64, t32 := o.tokens(q, pr)
	mid := kvcache.RequestID(i + 1)
	o.run.Requests++

	var local, fromPool, loadedPages int
	served := false
	for attempt := 0; attempt < 3 && !served; attempt++ {
		began := time.Now()
		ar, err := r.mgr.Allocate(mid, t32, len(t32))
		o.wall.alloc += time.Since(began)
		if err != nil {
			if errors.Is(err, kvcache.ErrOutOfPages) {
				break
			}
			return fmt.Errorf("request %s: allocate: %w", q.ID, err)
		}
		local = ar.ReusedTokens
		if err := o.drain(); err != nil {
			return err
		}
		began = time.Now()
		o.pool.lookup = true
		m, _, err := r.sched.Lookup(o.ctx, connector.Request{ID: q.ID, Tokens: t64, Scope: q.Scope, ContextOnly: true}, local)
		o.pool.lookup = false
		if err != nil {
			return fmt.Errorf("request %s: lookup: %w", q.ID, err)
		}
		pages := [][]int{r.pages[0][:pr.blocks]}
		if err := r.sched.UpdateStateAfterAlloc(q.ID, pages, m); err != nil {
			return fmt.Errorf("request %s: %w", q.ID, err)
		}
		out := connector.SchedulerOutput{
			NewRequests: []connector.RequestData{{
				ID: q.ID, NewBlockIDsByGroup: pages, ComputedPosition: local, NumScheduledTokens: len(t32) - local - m,
			}},
			SubmittedSaves: r.w.TakeSubmittedSaves(),
		}
		meta, err := r.sched.BuildMeta(out)
		if err != nil {
			return fmt.Errorf("request %s: build metadata: %w", q.ID, err)
		}
		o.wall.lookup += time.Since(began)
		began = time.Now()
		r.w.BindMeta(meta)
		if err := r.w.StartLoad(o.ctx); err != nil {
			return fmt.Errorf("request %s: load: %w", q.ID, err)
		}
		o.wall.load += time.Since(began)
		if slices.Contains(r.w.TakeFailedLoadRequests(), q.ID) {
			o.run.FailedLoads++
			r.sched.RequestReset(q.ID)
			if err := r.mgr.Revert(mid); err != nil {
				return err
			}
			continue
		}
		for _, l := range meta.Loads {
			loadedPages += len(l.Pages)
		}
		fromPool = m
		if err := r.w.WaitForSave(o.ctx); err != nil {
			return fmt.Errorf("request %s: save: %w", q.ID, err)
		}
		if r.sched.RequestFinished(q.ID) {
			r.saving = append(r.saving, q.ID)
		}
		if err := r.mgr.Commit(mid, t32); err != nil {
			return fmt.Errorf("request %s: commit: %w", q.ID, err)
		}
		if err := r.mgr.Free(mid); err != nil {
			return err
		}
		served = true
	}
	if !served {
		o.run.FailedRequests++
		local, fromPool = 0, 0
	}

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

// drain waits until every rank's finished requests have their saves done, so that the pool
// state the next lookup or eviction tick sees follows arrival order, whatever the save
// goroutines' timing. Saves overlap the replay's own work until then.
func (o *offline) drain() error {
	began := time.Now()
	waited := false
	for _, r := range o.ranks {
		if len(r.saving) == 0 {
			continue
		}
		waited = true
		gen := r.saving
		left := len(r.saving)
		for left > 0 {
			fs, _, err := r.w.GetFinished(gen, nil)
			if err != nil {
				return err
			}
			gen = nil
			left -= len(fs)
			if left > 0 {
				runtime.Gosched()
			}
		}
		r.saving = r.saving[:0]
	}
	if waited {
		if u := o.usedBytes(); u > o.peakUsed {
			o.peakUsed = u
		}
	}
	o.wall.save += time.Since(began)
	return nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (o *offline) finish() error {
	run := &o.run
	holes := o.pool.holes
	for _, r := range o.ranks {
		run.RankLoad = append(run.RankLoad, r.load)
	}
	run.Holes = HoleCounts{
		Lookups: holes.Lookups, LookedUpBlocks: holes.LookedUpBlocks, HitBlocks: holes.HitBlocks,
		Holes: holes.Holes, HoleBlocks: holes.HoleBlocks,
		RecomputedStoredTokens: holes.RecomputedStoredTokens * TraceBlockTokens / int64(o.p.TokensPerBlock),
	}
	if o.t.Format != FormatMooncake {
		run.Holes.RecomputedStoredTokens = holes.RecomputedStoredTokens
	}
	st, err := o.emb.Stats(context.Background())
	if err != nil {
		return err
	}
	sim := int64(o.p.SimPageBytes)
	run.Pool.PeakUsedBytes = o.peakUsed / sim * o.p.PageBytes
	run.Pool.FinalUsedBytes = st.UsedBytes / sim * o.p.PageBytes
	if run.Pool.CapacityBytes > 0 {
		run.Pool.PeakOccupancy = float64(run.Pool.PeakUsedBytes) / float64(run.Pool.CapacityBytes)
	}
	run.Pool.Objects = st.Objects
	run.Pool.Puts = st.Puts
	run.Pool.PutFailures = o.pool.putFailed.Load()
	run.Pool.EvictionRounds = o.evictRounds.Load()
	run.Pool.Evicted = o.evicted.Load()
	run.Pool.EvictedSoftPinned = st.EvictedSoftPinned
	run.Pool.EvictedGrouped = st.EvictedGrouped
	run.Moved.SavedPages = o.pool.putOK.Load()
	run.Moved.LoadedBytes = run.Moved.LoadedPages * o.p.PageBytes
	run.Moved.SavedBytes = run.Moved.SavedPages * o.p.PageBytes
	run.Time.SaveSec = float64(run.Moved.SavedBytes) / o.p.SaveBandwidth
	if in := float64(run.Tokens.Input); in > 0 {
		run.HitRate = HitRates{
			Local: float64(run.Tokens.LocalHit) / in,
			Pool:  float64(run.Tokens.PoolHit) / in,
			Total: float64(run.Tokens.LocalHit+run.Tokens.PoolHit) / in,
		}
	}
	if n := len(o.ttfts); n > 0 {
		var sum float64
		for _, v := range o.ttfts {
			sum += v
		}
		slices.Sort(o.ttfts)
		run.Latency = Latency{MeanTTFTSec: sum / float64(n), P50TTFTSec: quantile(o.ttfts, 0.5), P99TTFTSec: quantile(o.ttfts, 0.99)}
	}
	run.Balance = balance(run.RankLoad)
	run.Wall = WallTimes{
		LookupSec: o.wall.lookup.Seconds(), AllocSec: o.wall.alloc.Seconds(), LoadSec: o.wall.load.Seconds(),
		SaveSec: o.wall.save.Seconds(), EvictSec: o.wall.evict.Seconds(),
	}
	return nil
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func balance(rs []RankLoad) Balance {
	var b Balance
	var rsum, bsum, rmax, bmax float64
	for _, r := range rs {
		rsum += float64(r.RecomputedTokens)
		bsum += r.BusySec
		rmax = max(rmax, float64(r.RecomputedTokens))
		bmax = max(bmax, r.BusySec)
	}
	n := float64(len(rs))
	if rsum > 0 {
		b.RecomputedMaxOverMean = rmax / (rsum / n)
	}
	if bsum > 0 {
		b.BusyMaxOverMean = bmax / (bsum / n)
	}
	return b
}
