package replay

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvctl/kvctl/core/connector"
	"github.com/kvctl/kvctl/core/kvcache"
)

// The scheduler model (--set scheduler=true): each rank runs the scheduling passes of the
// seed's KVCacheV2Scheduler over its KV cache manager in virtual time, instead of serving every
// request at once. A pass charges a token budget and request slots (kvcache.Pass); generation
// requests take one token each, context requests continue their chunked prefill, and waiting
// requests are admitted in arrival order with a first chunk sized by the budget left:
//
//   - With completion reservations in force (the connector declares
//     requires_completion_reservation; --set completion_reservation; a disaggregated server
//     only, --set server=context or generation) a request is admitted only
//     while its bound (prompt + output + generation lead) fits every pool beside the bounds of
//     the requests already admitted (kvcache.AdmitGeneration). A refused request's cache is
//     freed rather than kept suspended (--set free_refused_generation=false keeps it).
//   - With admission queries (--set admission_query, and a single rank: they are off under
//     attention DP) the connector is asked once the first chunk is sized and allocated, and the
//     offer is covered at once (kvcache.CoverAdmissionOffer): when the pool cannot cover the
//     shifted window the chunk is released and the request deferred, up to max_offer_deferrals
//     passes. Without them the connector is asked after the batch is final and an offer that
//     cannot grow is shrunk to the whole blocks the chunk's pages hold.
//   - With async_load, a chunk whose offer is asynchronous parks until its load is done, and up
//     to max_uncharged_parks such chunks per pass are admitted without a token charge.
//
// A request whose next token or chunk finds no page preempts the most recently admitted
// running request that is not parked (it may be itself): its cache is reverted and it waits to
// be admitted again. That is what completion reservations exist to prevent. A parked request
// keeps its pages, the destination of its transfer.
//
// An asynchronous transfer starts when its rank's load worker is free and reads the pool then
// (asyncload.go): a page evicted since the lookup fails the load, and the request restarts
// without the offer at the head of its rank's line (RunReport.FailedLoads), as a synchronous
// load that lost a page does.

// SchedulerCounts is what the scheduler model did over a run.
type SchedulerCounts struct {
	// Passes is the scheduling passes run over all ranks.
	Passes int64 `json:"passes"`
	// Admissions counts first chunks admitted, re-admissions after a preemption, a deferral or
	// a failed load included.
	Admissions int64 `json:"admissions"`
	// AdmissionQueries counts connector queries made at admission.
	AdmissionQueries int64 `json:"admission_queries"`
	// OffersCovered, Deferrals and OffersShrunk say how connector offers were placed.
	OffersCovered int64 `json:"offers_covered"`
	Deferrals     int64 `json:"deferrals"`
	OffersShrunk  int64 `json:"offers_shrunk"`
	// UnchargedParks counts parking chunks admitted without a token charge.
	UnchargedParks int64 `json:"uncharged_parks"`
	// Parked counts chunks that parked for an asynchronous load.
	Parked int64 `json:"parked"`
	// ReservationsRefused counts admissions refused because a completion bound did not fit;
	// RefusedFreed those whose cache was freed rather than kept.
	ReservationsRefused int64 `json:"reservations_refused"`
	RefusedFreed        int64 `json:"refused_freed"`
	// PeakReservationsHeld and PeakReservedBlocks are the most requests holding a bound at the
	// end of a pass, and the most blocks those bounds still kept back.
	PeakReservationsHeld int64 `json:"peak_reservations_held"`
	PeakReservedBlocks   int64 `json:"peak_reserved_blocks"`
	// RequestsWaited counts requests that waited at least one pass on their rank before their
	// first admission; WaitPasses sums those passes.
	RequestsWaited int64 `json:"requests_waited"`
	WaitPasses     int64 `json:"wait_passes"`
	// Preemptions counts admitted requests preempted for lack of pages; PreemptedRequests the
	// distinct requests that were.
	Preemptions       int64 `json:"preemptions"`
	PreemptedRequests int64 `json:"preempted_requests"`
	// LongPrefillsDemoted counts the requests the long-prefill demotion (--set
	// long_prefill_tokens) moved behind a waiting request with a smaller uncached prefill.
	LongPrefillsDemoted int64 `json:"long_prefills_demoted"`
}

// What a rank serves in the scheduler model.
const (
	// ServerAggregated ranks run whole requests. Completion reservations never apply there
	// (seed commit 6: only a disaggregated target manager reserves), so a request that runs
	// out of pages preempts, as TensorRT-LLM does.
	ServerAggregated = "aggregated"
	// ServerContext ranks are disaggregated context servers: a request ends with its prompt,
	// and a first chunk is bound through the end of the prompt (kvcache.AdmitContext).
	ServerContext = "context"
	// ServerGeneration ranks are disaggregated generation servers: a request's prompt KV
	// arrives from its context server (no prefill time is charged for it), its completion
	// bound is the prompt, the output and the generation lead (kvcache.AdmitGeneration), and a
	// refused request's cache is freed.
	ServerGeneration = "generation"
)

// Scheduler model defaults.
const (
	DefaultMaxNumTokens      = 8192
	DefaultMaxBatchSize      = 256
	DefaultMaxOfferDeferrals = 2
)

type schedPhase uint8

const (
	phaseWaiting schedPhase = iota
	phaseContext
	phaseParked
	phaseGenerating
)

// schedReq is one request in a rank's scheduler model.
type schedReq struct {
	i      int
	q      Request
	pr     prepared
	mid    kvcache.RequestID
	t64    []int64
	output int // replay tokens to generate
	// uncached is the router's estimate of the request's prefill, in trace tokens: what the
	// router publishes as its uncached-prefill count, which the long-prefill demotion reads.
	uncached  int
	demoted   bool
	phase     schedPhase
	allocated bool // holds an allocation (admitted, or suspended after a refusal)
	queued    time.Duration

	reused, honoured int
	computed         int // prompt tokens computed, restored ones included
	generated        int
	loadedPages      int
	loadSec          float64
	parkedUntil      time.Duration
	admittedAt       time.Duration
	waitPasses       int
	admittedOnce     bool
	wasPreempted     bool
	lookedUp         bool // the connector was asked for this allocation
	async            bool // the offer loads asynchronously: the chunk parks
	epoch            uint64
	firstChunk       int // tokens the first chunk computes after the restored ones
	accounted        bool
}

// rankSched is one rank's scheduler state.
type rankSched struct {
	clock   time.Duration
	waiting []*schedReq
	running []*schedReq // admission order
}

func (s *rankSched) idle() bool { return len(s.waiting) == 0 && len(s.running) == 0 }

// schedScale is how many trace tokens one replay token stands for.
func (o *offline) schedScale() float64 {
	if o.t.Format == FormatMooncake {
		return float64(TraceBlockTokens) / float64(o.p.TokensPerBlock)
	}
	return 1
}

// enqueue hands request q (trace position i) to rank rk's scheduler, with the router's
// estimate of its uncached prefill.
func (o *offline) enqueue(i int, q Request, rk int, notBefore time.Duration, uncached int) {
	r := o.ranks[rk]
	T := o.p.TokensPerBlock
	pr := prepare(o.t.Format, q, T)
	t64 := o.tokens(q, pr)
	out := q.OutputLength
	if o.t.Format == FormatMooncake {
		out = (q.OutputLength*T + TraceBlockTokens - 1) / TraceBlockTokens
	}
	if o.c.Server == ServerContext {
		out = 0 // the generation server decodes
	}
	sr := &schedReq{i: i, q: q, pr: pr, mid: kvcache.RequestID(i + 1), t64: slices.Clone(t64),
		output: out, queued: max(notBefore, q.Arrival), uncached: uncached}
	o.run.Requests++
	if r.sch.idle() {
		r.sch.clock = max(r.sch.clock, sr.queued)
	}
	r.sch.waiting = append(r.sch.waiting, sr)
}

// runPasses runs every rank's passes that start before until, earliest first.
func (o *offline) runPasses(until time.Duration) error {
	for {
		r := o.nextRank(until)
		if r == nil {
			return nil
		}
		if err := o.pass(r); err != nil {
			return err
		}
	}
}

// runUntilEvent runs passes until a router event is pending, for a capped router waiting for a
// request to finish. It reports false when no rank has work left.
func (o *offline) runUntilEvent() (bool, error) {
	for len(o.ev) == 0 {
		r := o.nextRank(math.MaxInt64)
		if r == nil {
			return false, nil
		}
		if err := o.pass(r); err != nil {
			return false, err
		}
	}
	return true, nil
}

func (o *offline) nextRank(until time.Duration) *rank {
	var best *rank
	for _, r := range o.ranks {
		if r.sch.idle() || r.sch.clock >= until {
			continue
		}
		if best == nil || r.sch.clock < best.sch.clock {
			best = r
		}
	}
	return best
}

// pass runs one scheduling pass of rank r at its clock.
func (o *offline) pass(r *rank) error {
	s, c := r.sch, o.c
	sc := o.run.Scheduler
	if err := o.settleSaves(); err != nil {
		return err
	}
	if err := o.advance(s.clock); err != nil {
		return err
	}
	sc.Passes++
	p := r.mgr.BeginPass(c.MaxNumTokens, c.MaxBatchSize, false)
	var prefill int
	var decode bool
	var syncLoadSec float64
	var ctxDone, finished []*schedReq
	progress := false

	// Requests already admitted, in admission order.
	for k := 0; k < len(s.running); k++ {
		q := s.running[k]
		switch q.phase {
		case phaseParked:
			if s.clock < q.parkedUntil {
				continue
			}
			q.phase = phaseContext
			progress = true
			fallthrough
		case phaseContext:
			budget, _ := p.Budget()
			chunk := min(len(q.t64)-q.computed, budget)
			if chunk < 1 {
				continue
			}
			if _, ok := p.Admit(chunk, false); !ok {
				continue
			}
			if err := o.growOrPreempt(r, q, q.computed+chunk); err != nil {
				if errors.Is(err, errPreemptedSelf) {
					k--
					continue
				}
				return err
			}
			k = slices.Index(s.running, q)
			q.computed += chunk
			prefill += chunk
			progress = true
			if q.computed == len(q.t64) {
				ctxDone = append(ctxDone, q)
			}
		case phaseGenerating:
			if _, ok := p.Admit(1, false); !ok {
				continue
			}
			if err := o.growOrPreempt(r, q, len(q.t64)+q.generated+1); err != nil {
				if errors.Is(err, errPreemptedSelf) {
					k--
					continue
				}
				return err
			}
			k = slices.Index(s.running, q)
			q.generated++
			decode = true
			progress = true
			if q.generated >= q.output {
				finished = append(finished, q)
			}
		}
	}

	// Waiting requests, in arrival order. A request that cannot be admitted holds the line; a
	// deferred one leaves the head of the line to the others. Long prefills go behind the rest.
	if c.LongPrefillTokens > 0 {
		demoteLongPrefills(s, c.LongPrefillTokens, sc)
	}
	var admitted []*schedReq
	for k := 0; k < len(s.waiting); {
		q := s.waiting[k]
		ok, deferred, err := o.admit(r, p, q)
		if err != nil {
			return err
		}
		if ok {
			s.waiting = slices.Delete(s.waiting, k, k+1)
			admitted = append(admitted, q)
			progress = true
			continue
		}
		if !deferred {
			break
		}
		progress = true
		k++
	}

	// The batch is final: connector work for the admitted first chunks.
	for _, q := range admitted {
		sec, err := o.startRequest(r, q)
		if err != nil {
			return err
		}
		if q.phase != phaseContext {
			continue // parked for an asynchronous load, or a failed load restarted without the offer
		}
		syncLoadSec += sec
		// The first chunk computes in this pass, after the restored tokens.
		chunk := min(len(q.t64)-q.computed, q.firstChunk)
		q.computed += chunk
		prefill += chunk
		if q.computed == len(q.t64) {
			ctxDone = append(ctxDone, q)
		}
	}
	for _, q := range s.waiting {
		q.waitPasses++
	}

	scale := o.schedScale()
	if c.Server == ServerGeneration {
		prefill = 0 // the context server computed the prompt; its KV arrives by transfer
	}
	dur := float64(prefill)*scale/o.p.PrefillTokensPerSecond + syncLoadSec
	if decode {
		dur += scale / o.p.DecodeTokensPerSecond
	}
	end := s.clock + seconds(dur)
	for _, q := range ctxDone {
		if err := o.contextDone(r, q, end); err != nil {
			return err
		}
		if q.output == 0 {
			finished = append(finished, q)
		}
	}
	for _, q := range finished {
		if err := o.finishRequest(r, q, end); err != nil {
			return err
		}
	}
	n, blocks := r.mgr.ReservationsHeld()
	sc.PeakReservationsHeld = max(sc.PeakReservationsHeld, int64(n))
	sc.PeakReservedBlocks = max(sc.PeakReservedBlocks, int64(blocks))
	r.load.BusySec += dur
	if progress || dur > 0 {
		s.clock = max(end, s.clock+time.Nanosecond)
		return nil
	}
	return o.stalled(r)
}

// stalled moves a rank that could make no progress: to the end of its earliest parked load, or,
// with nothing running that could free pages, it fails the request at the head of the line,
// which can never fit this rank's cache.
func (o *offline) stalled(r *rank) error {
	s := r.sch
	next := time.Duration(math.MaxInt64)
	for _, q := range s.running {
		if q.phase == phaseParked {
			next = min(next, q.parkedUntil)
		}
	}
	if next != math.MaxInt64 {
		s.clock = max(next, s.clock+time.Nanosecond)
		return nil
	}
	if len(s.running) > 0 || len(s.waiting) == 0 {
		return fmt.Errorf("rank %d: the scheduler model made no progress with %d running and %d waiting requests", r.idx, len(s.running), len(s.waiting))
	}
	q := s.waiting[0]
	s.waiting = s.waiting[1:]
	if q.allocated {
		if err := r.mgr.Revert(q.mid); err != nil {
			return err
		}
	}
	o.run.FailedRequests++
	o.push(s.clock, q.q.ID, false)
	o.push(s.clock, q.q.ID, true)
	o.account(r, q, s.clock, s.clock)
	return nil
}

var errPreemptedSelf = errors.New("preempted itself")

// growOrPreempt grows q's allocation to numTokens, preempting the most recently admitted
// running request for pages until it fits. It returns errPreemptedSelf when q itself was
// preempted.
func (o *offline) growOrPreempt(r *rank, q *schedReq, numTokens int) error {
	for {
		err := r.mgr.Grow(q.mid, numTokens)
		if err == nil {
			return nil
		}
		if !errors.Is(err, kvcache.ErrOutOfPages) {
			return fmt.Errorf("request %s: grow: %w", q.q.ID, err)
		}
		if len(r.sch.running) == 1 {
			// Alone on the rank and still out of pages: it can never fit this cache.
			if err := o.dropRequest(r, q); err != nil {
				return err
			}
			return errPreemptedSelf
		}
		victim := o.victim(r)
		if err := o.preempt(r, victim); err != nil {
			return err
		}
		if victim == q {
			return errPreemptedSelf
		}
	}
}

// victim is the request a request short of pages preempts: the most recently admitted running
// request that is not parked. A parked request's pages are the destination of its transfer,
// queued or under way, so they are not taken from it; the request growing is never parked, so
// there is always a victim.
func (o *offline) victim(r *rank) *schedReq {
	for _, q := range slices.Backward(r.sch.running) {
		if q.phase != phaseParked {
			return q
		}
	}
	return nil
}

// dropRequest fails a running request that cannot fit the rank's cache even alone.
func (o *offline) dropRequest(r *rank, q *schedReq) error {
	if err := r.local.RequestReset(o.ctx, q.q.ID); err != nil {
		return err
	}
	if err := r.mgr.Revert(q.mid); err != nil {
		return err
	}
	r.sch.running = slices.DeleteFunc(r.sch.running, func(x *schedReq) bool { return x == q })
	o.run.FailedRequests++
	if !q.accounted {
		q.accounted = true
		o.push(r.sch.clock, q.q.ID, false)
		q.reused, q.honoured, q.loadedPages, q.loadSec = 0, 0, 0, 0
		o.account(r, q, r.sch.clock, r.sch.clock)
	}
	o.push(r.sch.clock, q.q.ID, true)
	return nil
}

// demoteLongPrefills is the V2 scheduler's long-prefill demotion (seed commit 20): the waiting
// requests whose uncached-prefill count exceeds limit move behind the others, each group in
// its order, so that a request whose prefill is mostly restored from the pool is not held
// behind one that computes a long prompt. The count is the router's estimate, not the prompt
// length: a later turn of a conversation with a long prompt and little growth is not long.
func demoteLongPrefills(s *rankSched, limit int, sc *SchedulerCounts) {
	short := 0
	for _, q := range s.waiting {
		if q.uncached <= limit {
			short++
		}
	}
	if short == 0 || short == len(s.waiting) {
		return
	}
	out := make([]*schedReq, 0, len(s.waiting))
	var long []*schedReq
	seenShort := 0
	for _, q := range s.waiting {
		if q.uncached <= limit {
			out = append(out, q)
			seenShort++
			continue
		}
		if seenShort < short && !q.demoted {
			q.demoted = true // a shorter prefill behind it goes first
			sc.LongPrefillsDemoted++
		}
		long = append(long, q)
	}
	s.waiting = append(out, long...)
}

// preempt reverts an admitted request's cache and puts it back at the head of the line.
func (o *offline) preempt(r *rank, q *schedReq) error {
	sc := o.run.Scheduler
	sc.Preemptions++
	if !q.wasPreempted {
		q.wasPreempted = true
		sc.PreemptedRequests++
	}
	if err := r.local.RequestReset(o.ctx, q.q.ID); err != nil {
		return err
	}
	if err := r.mgr.Revert(q.mid); err != nil {
		return err
	}
	r.sch.running = slices.DeleteFunc(r.sch.running, func(x *schedReq) bool { return x == q })
	q.reset()
	r.sch.waiting = slices.Insert(r.sch.waiting, 0, q)
	return nil
}

// prompt is what the KV cache manager keys q's blocks by.
func (q *schedReq) prompt() kvcache.Prompt { return kvcache.Prompt{Tokens: q.t64, Scope: q.q.Scope} }

func (q *schedReq) reset() {
	q.phase, q.allocated = phaseWaiting, false
	q.reused, q.honoured, q.computed, q.generated = 0, 0, 0, 0
	q.loadedPages, q.loadSec, q.lookedUp, q.async, q.firstChunk = 0, 0, false, false, 0
}

// admit tries to admit waiting request q's first chunk in pass p. deferred reports an offer
// the pool could not cover, whose chunk was released for a later pass.
func (o *offline) admit(r *rank, p *kvcache.Pass, q *schedReq) (ok, deferred bool, err error) {
	s, c, sc := r.sch, o.c, o.run.Scheduler
	budget, slots := p.Budget()
	if slots < 1 {
		return false, false, nil
	}
	if !q.allocated {
		mr, err := r.mgr.Match(q.prompt())
		if err != nil {
			return false, false, fmt.Errorf("request %s: match: %w", q.q.ID, err)
		}
		chunk := min(len(q.t64)-mr.Tokens, budget)
		if chunk < 1 {
			// Only a chunk admitted without a charge (one that parks) fits an empty budget.
			if !r.queries || c.MaxUnchargedParks == 0 {
				return false, false, nil
			}
			chunk = min(len(q.t64)-mr.Tokens, c.MaxNumTokens)
		}
		ar, err := r.mgr.Allocate(q.mid, q.prompt(), mr.Tokens+chunk)
		if errors.Is(err, kvcache.ErrOutOfPages) {
			return false, false, nil
		}
		if err != nil {
			return false, false, fmt.Errorf("request %s: allocate: %w", q.q.ID, err)
		}
		q.allocated, q.reused, q.epoch, q.firstChunk = true, ar.ReusedTokens, ar.Epoch, chunk
	}
	if r.mgr.Reserving() {
		admit := func() error { return r.mgr.AdmitGeneration(q.mid, len(q.t64), q.output) }
		if c.Server == ServerContext {
			admit = func() error { return r.mgr.AdmitContext(q.mid, len(q.t64)) }
		}
		if err := admit(); err != nil {
			if !errors.Is(err, kvcache.ErrNoReservation) {
				return false, false, fmt.Errorf("request %s: %w", q.q.ID, err)
			}
			sc.ReservationsRefused++
			if c.FreeRefusedGeneration {
				if err := r.mgr.Revert(q.mid); err != nil {
					return false, false, err
				}
				q.allocated = false
				sc.RefusedFreed++
			}
			return false, false, nil
		}
	}
	release := func() error {
		if q.lookedUp {
			if err := r.local.RequestReset(o.ctx, q.q.ID); err != nil {
				return err
			}
		}
		q.lookedUp, q.honoured, q.async = false, 0, false
		if !q.allocated {
			return nil
		}
		q.allocated = false
		return r.mgr.Revert(q.mid)
	}
	if r.queries {
		m, async, err := o.lookup(r, q, true)
		if err != nil {
			return false, false, err
		}
		sc.AdmissionQueries++
		if m > 0 {
			if err := r.mgr.SetOffer(q.mid, kvcache.Offer{Epoch: q.epoch, Tokens: m, Async: async}); err != nil {
				return false, false, fmt.Errorf("request %s: %w", q.q.ID, err)
			}
			cr, err := r.mgr.CoverAdmissionOffer(q.mid, q.firstChunk, false)
			if err != nil {
				return false, false, fmt.Errorf("request %s: %w", q.q.ID, err)
			}
			switch cr.Outcome {
			case kvcache.Deferred:
				// The manager released the chunk's pages and its bound.
				sc.Deferrals++
				q.allocated = false
				return false, true, release()
			case kvcache.Shrunk:
				sc.OffersShrunk++
				held, _ := r.mgr.Held(q.mid)
				q.firstChunk = min(q.firstChunk, max(held*o.p.TokensPerBlock-q.reused-cr.Tokens, 0))
			default:
				sc.OffersCovered++
			}
			r.mgr.TakeOffer(q.mid)
			q.honoured, q.async = cr.Tokens, async
		}
	}
	charged, ok := p.Admit(q.firstChunk, q.async)
	if !ok {
		return false, false, release()
	}
	if q.async && charged == 0 {
		sc.UnchargedParks++
	}
	q.admittedAt = s.clock
	sc.Admissions++
	if !q.admittedOnce {
		q.admittedOnce = true
		if q.waitPasses > 0 {
			sc.RequestsWaited++
			sc.WaitPasses += int64(q.waitPasses)
		}
	}
	return true, false, nil
}

// lookup asks rank r's connector for q's prefix past its local match, at admission or once the
// batch is final.
func (o *offline) lookup(r *rank, q *schedReq, admission bool) (int, bool, error) {
	if err := o.drain(); err != nil {
		return 0, false, err
	}
	call := r.local.Lookup
	if admission {
		call = r.local.AdmissionQuery
	}
	began := time.Now()
	o.pool.lookup = true
	m, async, err := call(o.ctx, connector.Request{ID: q.q.ID, Tokens: q.t64, Scope: q.q.Scope, ContextOnly: true}, q.reused)
	o.pool.lookup = false
	o.wall.lookup += time.Since(began)
	if err != nil {
		return 0, false, fmt.Errorf("request %s: lookup: %w", q.q.ID, err)
	}
	q.lookedUp = true
	return m, async, nil
}

// startRequest does the connector work of an admitted first chunk once the batch is final:
// the lookup when no admission query was made (an offer that cannot grow its allocation is
// shrunk to the whole blocks the chunk's pages hold), the allocation report, and the load,
// synchronous or parked. It returns the modelled synchronous load time. A request whose load
// lost a page is restarted without the offer: it is back at the head of the line.
func (o *offline) startRequest(r *rank, q *schedReq) (float64, error) {
	sc := o.run.Scheduler
	T := o.p.TokensPerBlock
	id := q.q.ID
	if !q.lookedUp {
		m, async, err := o.lookup(r, q, false)
		if err != nil {
			return 0, err
		}
		if m > 0 {
			if err := r.mgr.Grow(q.mid, q.reused+m+q.firstChunk); err == nil {
				sc.OffersCovered++
				q.honoured = m
			} else {
				if !errors.Is(err, kvcache.ErrOutOfPages) {
					return 0, fmt.Errorf("request %s: grow: %w", id, err)
				}
				sc.OffersShrunk++
				held, _ := r.mgr.Held(q.mid)
				q.honoured = min(m, max(held*T-q.reused, 0)/T*T)
				q.firstChunk = min(q.firstChunk, max(held*T-q.reused-q.honoured, 0))
			}
			q.async = async
		}
	}
	pages := [][]int{r.pages[0][:q.pr.blocks]}
	if err := r.local.UpdateStateAfterAlloc(o.ctx, id, pages, q.honoured); err != nil {
		return 0, fmt.Errorf("request %s: %w", id, err)
	}
	submitted, err := r.local.TakeSubmittedSaves(o.ctx)
	if err != nil {
		return 0, err
	}
	meta, err := r.local.BuildMeta(o.ctx, connector.SchedulerOutput{
		NewRequests:    []connector.RequestData{{ID: id, NewBlockIDsByGroup: pages, ComputedPosition: q.reused}},
		SubmittedSaves: submitted,
	})
	if err != nil {
		return 0, fmt.Errorf("request %s: build metadata: %w", id, err)
	}
	for _, set := range [][]connector.RequestTransfers{meta.Loads, meta.AsyncLoads} {
		for _, l := range set {
			q.loadedPages += len(l.Pages)
		}
	}
	q.loadSec = float64(q.loadedPages) * float64(o.p.PageBytes) / o.p.LoadBandwidth
	q.computed = q.reused + q.honoured
	if q.async {
		// The transfer queues behind the rank's load worker and reads the pool when it starts
		// (asyncload.go); one that starts now runs now.
		if q.parkedUntil, err = o.parkLoad(r, q, meta, q.loadedPages); err != nil {
			return 0, err
		}
		q.phase = phaseParked
		sc.Parked++
		r.sch.running = append(r.sch.running, q)
		for len(r.queued) > 0 && r.queued[0].start <= o.now {
			if err = o.runLoad(r); err != nil {
				return 0, err
			}
		}
		return 0, nil
	}
	began := time.Now()
	if err = r.local.BindMeta(o.ctx, meta); err != nil {
		return 0, err
	}
	if err = r.local.StartLoad(o.ctx); err != nil {
		return 0, fmt.Errorf("request %s: load: %w", id, err)
	}
	failed, err := r.local.TakeFailedLoadRequests(o.ctx)
	if err != nil {
		return 0, err
	}
	o.wall.load += time.Since(began)
	if slices.Contains(failed, id) {
		o.run.FailedLoads++
		if err := r.local.RequestReset(o.ctx, id); err != nil {
			return 0, err
		}
		if err := r.mgr.Revert(q.mid); err != nil {
			return 0, err
		}
		q.reset()
		r.sch.waiting = slices.Insert(r.sch.waiting, 0, q)
		return 0, nil
	}
	q.phase = phaseContext
	r.sch.running = append(r.sch.running, q)
	return q.loadSec, nil
}

// contextDone commits q's prompt to the local cache, saves its computed blocks to the pool,
// ends the connector's part of the request and records its hits, when its last prompt chunk
// computed in the pass ending at end.
func (o *offline) contextDone(r *rank, q *schedReq, end time.Duration) error {
	id := q.q.ID
	if err := r.mgr.Commit(q.mid, q.t64); err != nil {
		return fmt.Errorf("request %s: commit: %w", id, err)
	}
	submitted, err := r.local.TakeSubmittedSaves(o.ctx)
	if err != nil {
		return err
	}
	meta, err := r.local.BuildMeta(o.ctx, connector.SchedulerOutput{
		CachedRequests: []connector.RequestData{{ID: id, NumScheduledTokens: len(q.t64)}},
		SubmittedSaves: submitted,
	})
	if err != nil {
		return fmt.Errorf("request %s: build metadata: %w", id, err)
	}
	if err = r.local.BindMeta(o.ctx, meta); err != nil {
		return err
	}
	if err = r.local.WaitForSave(o.ctx); err != nil {
		return fmt.Errorf("request %s: save: %w", id, err)
	}
	// The connector is done with the request: generated tokens are not saved. Its saves join
	// the ones drain waits for before the next lookup, so no save is in flight during one.
	saving, err := r.local.RequestFinished(o.ctx, id)
	if err != nil {
		return err
	}
	if saving {
		r.saving = append(r.saving, id)
	}
	q.phase = phaseGenerating
	if !q.accounted {
		q.accounted = true
		o.push(end, id, false)
		o.account(r, q, q.admittedAt, end)
	}
	return nil
}

// finishRequest ends q and frees its cache.
func (o *offline) finishRequest(r *rank, q *schedReq, end time.Duration) error {
	if err := r.mgr.Free(q.mid); err != nil {
		return err
	}
	r.sch.running = slices.DeleteFunc(r.sch.running, func(x *schedReq) bool { return x == q })
	o.push(end, q.q.ID, true)
	return nil
}

// account records q's hits and its modelled times: admitted at start, context done at ctxEnd.
func (o *offline) account(r *rank, q *schedReq, start, ctxEnd time.Duration) {
	computed := o.countHits(q.i, q.q, q.pr, q.reused, q.honoured, q.loadedPages)
	o.run.Time.LoadSec += q.loadSec
	o.run.Time.PrefillSec += float64(computed) / o.p.PrefillTokensPerSecond
	o.run.Time.QueueSec += max(start-q.q.Arrival, 0).Seconds()
	o.ttfts = append(o.ttfts, max(ctxEnd-q.q.Arrival, 0).Seconds())
	r.load.Requests++
	r.load.InputTokens += int64(q.q.InputLength)
	r.load.RecomputedTokens += computed
}
