package connector

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/kvmem"
	"github.com/kvctl/kvctl/core/stats"
	"github.com/kvctl/kvctl/pool"
)

// Scheduler is the scheduler adapter of one engine: it answers prefix lookups, keeps what each
// request was offered, honoured, loaded and saved, and turns every scheduler output into the
// metadata the engine's workers act on. Under tensor parallelism one runs on the scheduling
// rank; under attention DP one runs on every owner. Its methods are safe for concurrent use.
type Scheduler struct {
	opts  Options
	pool  pool.Pool
	log   *slog.Logger
	stats *stats.Reporter
	own   bool // stats was made here and is flushed by Close

	mu           sync.Mutex
	geom         *geometry
	reqs         map[string]*reqState
	unconfirmed  map[string]int // request -> block ordinal its last emitted saves end at
	pendingAsync []RequestTransfers
	warnedMM     bool
	// contextOnly holds, in speculative-prefill mode, the requests a lookup accepted as
	// context-only; BuildMeta refuses a new request outside it (the backstop of seed commit 5).
	contextOnly map[string]bool
	// early is the rank's worker once LinkEarlyLoads joined them: requests' loads start at
	// their allocation report (early.go).
	early *Worker
}

// reqState is what the adapter keeps per request.
type reqState struct {
	chain  hashChain
	tokens []int64
	pages  [][]int // per layer group, page index by block ordinal (-1: none)

	offerFirst  int // first offered block ordinal
	offerBlocks int // offered blocks, settled to the honoured part once the allocation is reported
	offerAsync  bool

	// lookupGen numbers this request's lookups. The pool is asked without the adapter's lock,
	// so a lookup whose answer arrives after a newer lookup of the same request started (or
	// after the request was forgotten) leaves the offer alone.
	lookupGen uint64

	savedUpto       int // blocks below are confirmed saved (or loaded)
	asyncLoadedUpto int // blocks below came from an asynchronous load and are never saved back
	emittedSaves    bool

	// earlyStarted: a load of this request began at its allocation report (early.go); forgetting
	// the request waits for it. earlyPages is a synchronous one's transfer, until BuildMeta
	// names the request in Metadata.EarlyLoads.
	earlyStarted bool
	earlyPages   []PageTransfer
}

// NewScheduler returns a scheduler adapter over pool. Lookups need a layout (RegisterLayout)
// unless the role does not load.
func NewScheduler(opts Options, pl pool.Pool) (*Scheduler, error) {
	if err := opts.Validate(); err != nil {
		return nil, fmt.Errorf("connector options: %w", err)
	}
	opts = opts.withDefaults()
	if pl == nil && opts.Role.Loads() {
		return nil, fmt.Errorf("a %s role needs a pool", opts.Role)
	}
	s := &Scheduler{
		opts:        opts,
		pool:        pl,
		log:         opts.Logger,
		reqs:        map[string]*reqState{},
		contextOnly: map[string]bool{},
		unconfirmed: map[string]int{},
	}
	if opts.Role.Loads() {
		r, own, err := reporterFor(opts)
		if err != nil {
			return nil, err
		}
		s.stats, s.own = r, own
	}
	return s, nil
}

// reporterFor returns the reporter the options name, or a log-only one of its own when only a
// stats interval is set.
func reporterFor(o Options) (*stats.Reporter, bool, error) {
	if o.Stats != nil {
		return o.Stats, false, nil
	}
	if o.StatsInterval <= 0 {
		return nil, false, nil
	}
	r, err := stats.NewReporter(stats.ReporterOptions{Interval: o.StatsInterval, Logger: o.Logger, Now: o.Clock})
	return r, true, err
}

// RegisterLayout gives the adapter the engine's page geometry, which its lookups key by.
func (s *Scheduler) RegisterLayout(l kvmem.Layout) error {
	if !s.opts.Role.Transfers() {
		return nil
	}
	g, err := newGeometry(l, s.opts)
	if err != nil {
		return fmt.Errorf("register layout: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.geom = g
	return nil
}

// Declarations returns what this connector declares to the engine's manager, before the
// manager's rules (see ReadDeclarations).
func (s *Scheduler) Declarations() Declarations { return declarations(s.opts) }

// Lookup answers how many tokens past numComputedTokens the pool can restore for req, and
// whether they are loaded asynchronously. It offers whole blocks only, always leaves the last
// prompt token to compute, and offers nothing to a role that does not load, to a local match
// that ends inside a block, or to a bypassed multimodal request. A later Lookup or
// AdmissionQuery of the same request replaces the offer.
func (s *Scheduler) Lookup(ctx context.Context, req Request, numComputedTokens int) (matchedTokens int, async bool, err error) {
	return s.lookup(ctx, req, numComputedTokens)
}

// AdmissionQuery is Lookup asked when the engine admits a first chunk. It only refills the
// request's offer; the transfer is built once the allocation is reported, so a repeated query,
// or the lookup after it, replaces the earlier answer.
func (s *Scheduler) AdmissionQuery(ctx context.Context, req Request, numComputedTokens int) (matchedTokens int, async bool, err error) {
	return s.lookup(ctx, req, numComputedTokens)
}

func (s *Scheduler) lookup(ctx context.Context, req Request, numComputed int) (int, bool, error) {
	if req.Dummy || !s.opts.Role.Transfers() {
		return 0, false, nil
	}
	if s.opts.SpeculativePrefill && !req.ContextOnly {
		return 0, false, fmt.Errorf("request %s: %w", req.ID, ErrNotContextOnly)
	}
	if numComputed < 0 || numComputed > len(req.Tokens) {
		return 0, false, fmt.Errorf("request %s: %d computed tokens out of %d", req.ID, numComputed, len(req.Tokens))
	}
	s.mu.Lock()
	locked := true
	defer func() {
		if locked {
			s.mu.Unlock()
		}
	}()
	if s.opts.SpeculativePrefill {
		s.contextOnly[req.ID] = true
	}
	if s.opts.bypassed(req) {
		if !s.warnedMM {
			s.warnedMM = true
			s.log.Warn("mooncake-store bypasses multimodal requests without multimodal hashes: they are neither looked up nor saved", "request", req.ID)
		}
		delete(s.reqs, req.ID)
		return 0, false, nil
	}
	st := s.reqs[req.ID]
	if st != nil && st.earlyPages != nil {
		return 0, false, fmt.Errorf("request %s: looked up again: %w", req.ID, errEarlyInFlight)
	}
	if st == nil {
		chain, err := s.opts.newChain(req)
		if err != nil {
			return 0, false, fmt.Errorf("request %s: %w", req.ID, err)
		}
		st = &reqState{chain: chain}
		s.reqs[req.ID] = st
	}
	if len(req.Tokens) < len(st.tokens) {
		return 0, false, fmt.Errorf("request %s: %w (%d tokens after %d)", req.ID, keys.ErrTokensShrank, len(req.Tokens), len(st.tokens))
	}
	if req.TokensOwned {
		st.tokens = req.Tokens[:len(req.Tokens):len(req.Tokens)]
	} else {
		st.tokens = append(st.tokens[:0:0], req.Tokens...)
	}
	if err := st.chain.Extend(st.tokens); err != nil {
		return 0, false, fmt.Errorf("request %s: %w", req.ID, err)
	}
	st.offerFirst, st.offerBlocks, st.offerAsync = 0, 0, false

	T := s.opts.TokensPerBlock
	if !s.opts.Role.Loads() || numComputed%T != 0 {
		return 0, false, nil
	}
	if s.geom == nil {
		return 0, false, ErrNoLayout
	}
	first := numComputed / T
	last := min(st.chain.Len(), (len(st.tokens)-1)/T)
	if first >= last {
		return 0, false, nil
	}
	st.lookupGen++
	gen := st.lookupGen
	probeKeys := s.blockKeys(st.chain, first, last)
	// The pool may be a network round trip away: other requests' lookups, allocations and
	// metadata of this engine go on meanwhile.
	s.mu.Unlock()
	locked = false
	// Locate, not only probe: a cluster pool keeps where the pages live for the load that
	// follows a hit.
	status := pool.Locate(ctx, s.pool, probeKeys)
	hit := s.countPrefixHit(status, last-first)
	s.stats.TickHoles()
	if hit == 0 {
		return 0, false, nil
	}
	s.mu.Lock()
	locked = true
	if s.reqs[req.ID] != st || st.lookupGen != gen {
		// A newer lookup of this request, or its end, overtook this one; its answer stands.
		return 0, false, nil
	}
	st.offerFirst, st.offerBlocks, st.offerAsync = first, hit, s.opts.AsyncLoad
	s.log.Debug("mooncake-store matched blocks", "request", req.ID, "blocks", hit, "tokens", hit*T)
	return hit * T, s.opts.AsyncLoad, nil
}

// blockKeys lists every key of blocks [first, last) of chain, block by block, for one
// existence probe. It reads only the geometry, which is fixed once the layout is registered.
// The keys share one string: a probe of n keys allocates three times, not n+1.
func (s *Scheduler) blockKeys(chain hashChain, first, last int) []string {
	g := s.geom
	n := (last - first) * g.keysPerBlock
	buf := make([]byte, 0, (last-first)*g.lookupBlockBytes)
	ends := make([]int, 0, n)
	for b := first; b < last; b++ {
		buf, ends = g.appendLookupKeys(buf, ends, chain.At(b))
	}
	all := string(buf)
	out := make([]string, len(ends))
	start := 0
	for i, end := range ends {
		out[i] = all[start:end]
		start = end
	}
	return out
}

// countPrefixHit folds the pool's answer for the keys of blocks candidate blocks (blockKeys
// order) into the number of leading complete blocks. The same answer feeds the hole stats. A
// failed probe or an answer of the wrong length is a miss.
func (s *Scheduler) countPrefixHit(status []int, blocks int) int {
	per := s.geom.keysPerBlock
	complete := make([]bool, blocks)
	if len(status) != blocks*per {
		s.log.Warn("batch_is_exist returned a wrong number of results; treating as a miss", "results", len(status), "keys", blocks*per)
	} else {
		for i := range blocks {
			complete[i] = true
			for _, v := range status[i*per : (i+1)*per] {
				if v != 1 {
					complete[i] = false
					break
				}
			}
		}
	}
	hit, hs := stats.FoldLookup(complete, s.opts.TokensPerBlock)
	s.stats.RecordLookup(hs)
	return hit
}

// CancelLoad trims the request's offer by the absolute token range [start, end) the engine
// will not take from the pool. A range touching the head of the offer moves its start past the
// range; one touching the tail cuts it before the range; a cut strictly inside is an error.
func (s *Scheduler) CancelLoad(reqID string, start, end int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.reqs[reqID]
	if st == nil || st.offerBlocks == 0 {
		return nil
	}
	if st.earlyPages != nil {
		return fmt.Errorf("request %s: %w", reqID, errEarlyInFlight)
	}
	T := s.opts.TokensPerBlock
	first, last := st.offerFirst, st.offerFirst+st.offerBlocks
	cf := max(first, start/T)
	cl := min(last, (end+T-1)/T)
	if cf >= cl {
		return nil
	}
	switch {
	case cf == first:
		st.offerFirst, st.offerBlocks = cl, last-cl
	case cl == last:
		st.offerBlocks = cf - first
	default:
		return fmt.Errorf("request %s: cancelling tokens [%d, %d) would cut blocks [%d, %d) out of the middle of the offer [%d, %d)", reqID, start, end, cf, cl, first, last)
	}
	return nil
}

// UpdateStateAfterAlloc settles the request's offer to the tokens the engine honoured, which
// must be a whole-block part of the offer. For an asynchronous offer it also builds the parked
// request's transfer from its full page lists (blockIDsByGroup[g][b] is the page of block b in
// group g); the transfer travels in the next BuildMeta's AsyncLoads, even when empty, since the
// engine parks the request regardless.
//
// A dummy report (a padding request, seed commit 3) is skipped whatever reqID names: a dummy
// may carry a real request's id, and its pages are not that request's.
func (s *Scheduler) UpdateStateAfterAlloc(reqID string, blockIDsByGroup [][]int, honouredTokens int, dummy bool) error {
	if dummy {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.reqs[reqID]
	if st == nil {
		return nil
	}
	T := s.opts.TokensPerBlock
	if honouredTokens < 0 || honouredTokens%T != 0 || honouredTokens/T > st.offerBlocks {
		return fmt.Errorf("request %s: %d honoured tokens are not a whole-block part of the offer of %d blocks of %d tokens", reqID, honouredTokens, st.offerBlocks, T)
	}
	if st.earlyStarted && st.offerBlocks > 0 {
		return fmt.Errorf("request %s: allocation reported again while the load of its first report is in flight", reqID)
	}
	st.offerBlocks = honouredTokens / T
	if !st.offerAsync {
		if s.early == nil || st.offerBlocks == 0 {
			return nil
		}
		if s.geom == nil {
			return ErrNoLayout
		}
		t, err := s.honouredTransfer(reqID, st, blockIDsByGroup)
		if errors.Is(err, errNoDestination) {
			return nil // the report does not name every page: the request loads at StartLoad
		}
		if err != nil {
			return err
		}
		if s.early.startEarly(reqID, t.Pages, false) != nil {
			return nil // the worker cannot take it: the request loads at StartLoad
		}
		st.earlyStarted, st.earlyPages = true, t.Pages
		return nil
	}
	if s.geom == nil {
		return ErrNoLayout
	}
	end := st.offerFirst + st.offerBlocks
	t, err := s.honouredTransfer(reqID, st, blockIDsByGroup)
	if err != nil {
		return err
	}
	if s.early != nil && len(t.Pages) > 0 && s.early.startEarly(reqID, t.Pages, true) == nil {
		st.earlyStarted = true
	} else {
		s.pendingAsync = append(s.pendingAsync, t)
	}
	st.asyncLoadedUpto = max(st.asyncLoadedUpto, end)
	st.offerFirst, st.offerBlocks, st.offerAsync = 0, 0, false
	return nil
}

// BuildMeta turns one scheduler output into the pass's metadata. It first settles the save
// confirmation report in out.SubmittedSaves: the saves emitted by the previous build count as
// stored for the requests named there, and are emitted again for the others. Then, per
// scheduled request, it extends the tokens and page lists, emits the loads of its honoured
// synchronous offer, and saves of the blocks past its save mark that this pass completes
// (computed position + honoured restore + scheduled tokens), bounded by the blocks that have a
// hash and a page in every group.
//
// In speculative-prefill mode a new request that no lookup accepted as context-only is refused
// with ErrNotContextOnly before any state is recorded: a request that skipped the lookup could
// otherwise have its draft KV saved from a pass that may reject draft tokens.
func (s *Scheduler) BuildMeta(out SchedulerOutput) (Metadata, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.SpeculativePrefill && s.opts.Role.Transfers() {
		for _, rd := range out.NewRequests {
			if !rd.Dummy && !s.contextOnly[rd.ID] {
				return Metadata{}, fmt.Errorf("request %s: %w; it reached the scheduler output without a context-only lookup", rd.ID, ErrNotContextOnly)
			}
		}
	}
	for _, id := range out.SubmittedSaves {
		if end, ok := s.unconfirmed[id]; ok {
			if st := s.reqs[id]; st != nil {
				st.savedUpto = max(st.savedUpto, end)
			}
		}
	}
	clear(s.unconfirmed)

	var meta Metadata
	meta.AsyncLoads, s.pendingAsync = s.pendingAsync, nil
	for _, set := range [][]RequestData{out.NewRequests, out.CachedRequests} {
		for i := range set {
			if err := s.buildOne(&set[i], &meta); err != nil {
				return Metadata{}, err
			}
		}
	}
	return meta, nil
}

func (s *Scheduler) buildOne(rd *RequestData, meta *Metadata) error {
	if rd.Dummy {
		return nil
	}
	st := s.reqs[rd.ID]
	if st == nil {
		return nil
	}
	if s.geom == nil {
		return ErrNoLayout
	}
	if len(rd.NewTokens) > 0 {
		st.tokens = append(st.tokens, rd.NewTokens...)
		if err := st.chain.Extend(st.tokens); err != nil {
			return fmt.Errorf("request %s: %w", rd.ID, err)
		}
	}
	ng := len(s.geom.groups)
	if len(rd.NewBlockIDsByGroup) > ng {
		return fmt.Errorf("request %s: page deltas for %d layer groups, the layout has %d", rd.ID, len(rd.NewBlockIDsByGroup), ng)
	}
	if st.pages == nil {
		st.pages = make([][]int, ng)
	}
	for g, delta := range rd.NewBlockIDsByGroup {
		for _, p := range delta {
			if p >= 0 {
				if err := s.geom.checkPage(g, p); err != nil {
					return fmt.Errorf("request %s: %w", rd.ID, err)
				}
			}
		}
		st.pages[g] = append(st.pages[g], delta...)
	}
	addressable := st.chain.Len()
	for _, p := range st.pages {
		addressable = min(addressable, len(p))
	}
	T := s.opts.TokensPerBlock

	restored := 0
	if st.earlyPages != nil {
		// The load began at the allocation report, into the pages reported then: this pass's
		// page lists must name the same ones.
		first, end := st.offerFirst, st.offerFirst+st.offerBlocks
		for i, p := range st.earlyPages {
			b := first + i/ng
			if b >= addressable || st.pages[p.Group][b] != p.Page {
				return fmt.Errorf("request %s: block %d in layer group %d: the scheduler output gives it another page than the allocation report whose early load wrote it", rd.ID, b, p.Group)
			}
		}
		meta.EarlyLoads = append(meta.EarlyLoads, rd.ID)
		restored = st.offerBlocks * T
		st.savedUpto = max(st.savedUpto, end)
		st.offerFirst, st.offerBlocks, st.earlyPages = 0, 0, nil
	}
	if st.offerBlocks > 0 && !st.offerAsync {
		first, end := st.offerFirst, st.offerFirst+st.offerBlocks
		t := RequestTransfers{RequestID: rd.ID}
		for b := first; b < end; b++ {
			if b >= addressable {
				return fmt.Errorf("request %s: honoured block %d has no destination page, and its tokens are already counted as computed", rd.ID, b)
			}
			for g := range ng {
				if st.pages[g][b] < 0 {
					return fmt.Errorf("request %s: honoured block %d has no page in layer group %d, and its tokens are already counted as computed", rd.ID, b, g)
				}
				t.Pages = append(t.Pages, PageTransfer{Hash: st.chain.At(b), Group: g, Page: st.pages[g][b]})
			}
		}
		meta.Loads = append(meta.Loads, t)
		restored = st.offerBlocks * T
		st.savedUpto = max(st.savedUpto, end)
		st.offerFirst, st.offerBlocks = 0, 0
	}

	if !s.opts.Role.Saves() {
		return nil
	}
	end := min(addressable, (rd.ComputedPosition+restored+rd.NumScheduledTokens)/T)
	start := max(st.savedUpto, st.asyncLoadedUpto)
	t := RequestTransfers{RequestID: rd.ID}
blocks:
	for b := start; b < end; b++ {
		for g := range ng {
			if st.pages[g][b] < 0 {
				continue blocks
			}
		}
		for g := range ng {
			t.Pages = append(t.Pages, PageTransfer{Hash: st.chain.At(b), Group: g, Page: st.pages[g][b]})
		}
	}
	if len(t.Pages) > 0 {
		meta.Saves = append(meta.Saves, t)
		s.unconfirmed[rd.ID] = end
		st.emittedSaves = true
	}
	return nil
}

// RequestFinished drops the request's state and reports whether saves were emitted for it, in
// which case the engine keeps its pages until GetFinished reports its saves done. A dummy's
// finish (seed commit 3) is skipped whatever reqID names, so a real request's state is kept.
func (s *Scheduler) RequestFinished(reqID string, dummy bool) (asyncSaving bool) {
	if dummy {
		return false
	}
	s.mu.Lock()
	st := s.reqs[reqID]
	s.forget(reqID)
	early := s.early
	s.mu.Unlock()
	if st != nil && st.earlyStarted {
		early.dropEarly(reqID)
	}
	return st != nil && st.emittedSaves
}

// RequestReset drops the request's state after the engine freed its allocation; the request
// replays and is looked up and saved afresh. An unconfirmed save and an asynchronous transfer
// not yet handed out are dropped too. A dummy's reset (seed commit 3) is skipped whatever reqID
// names.
func (s *Scheduler) RequestReset(reqID string, dummy bool) {
	if dummy {
		return
	}
	s.mu.Lock()
	st := s.reqs[reqID]
	s.forget(reqID)
	early := s.early
	s.mu.Unlock()
	if st != nil && st.earlyStarted {
		early.dropEarly(reqID)
	}
}

func (s *Scheduler) forget(reqID string) {
	delete(s.reqs, reqID)
	delete(s.contextOnly, reqID)
	delete(s.unconfirmed, reqID)
	kept := s.pendingAsync[:0]
	for _, t := range s.pendingAsync {
		if t.RequestID != reqID {
			kept = append(kept, t)
		}
	}
	clear(s.pendingAsync[len(kept):])
	s.pendingAsync = kept
}

// Close flushes the stats lines of a reporter the scheduler made itself.
func (s *Scheduler) Close() {
	if s.own {
		s.stats.Flush()
	}
}
