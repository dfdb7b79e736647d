package kvcache

import (
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/radix"
)

var (
	// ErrOutOfPages reports an allocation the pools cannot cover even after eviction.
	ErrOutOfPages = errors.New("out of KV cache pages")
	// ErrNoReservation reports a request whose completion bound does not fit.
	ErrNoReservation = errors.New("completion reservation does not fit")
	// ErrUnknownRequest reports a request id the manager does not hold.
	ErrUnknownRequest = errors.New("unknown request")
	// ErrDuplicateRequest reports an allocation for a request that already has one.
	ErrDuplicateRequest = errors.New("request already allocated")
	// ErrStaleOffer reports an admission offer made for an allocation that is gone.
	ErrStaleOffer = errors.New("admission offer is stale")
	// ErrShutdown reports a call after Shutdown.
	ErrShutdown = errors.New("kv cache manager is shut down")
	// ErrBadRequest reports inconsistent request arguments.
	ErrBadRequest = errors.New("invalid request arguments")
)

// RequestID names a request.
type RequestID uint64

// Options say where a manager sits.
type Options struct {
	// Draft marks a draft model's manager: it never drops its own backoff.
	Draft bool
	// Target is the target manager a draft pool pairs with; the draft aligns with it.
	Target *Manager
	// AttentionDP turns admission queries off.
	AttentionDP bool
}

// Manager is the KV cache manager model.
type Manager struct {
	cfg       Config
	decl      *Declarations
	opts      Options
	t         int
	backoff   int
	alignment int
	tree      *radix.Tree
	free      [][]int32
	pages     map[radix.NodeID][]int32
	host      *hostTier
	reqs      map[RequestID]*request
	reserve   bool
	bounds    map[RequestID]int // completion bounds in blocks
	deferrals map[RequestID]int
	warnings  []string
	epoch     uint64
	closed    bool
}

type request struct {
	tokens   []int64
	chain    *keys.Chain
	keys     []keys.Hash    // the chain's hashes
	shared   []radix.NodeID // tree blocks held, a prefix of the request's blocks
	private  [][]int32      // pages of the blocks after shared, one page per pool each
	reused   int            // local tokens reused at allocation
	computed int            // tokens committed
	epoch    uint64
	offer    *Offer
}

func (r *request) held() int { return len(r.shared) + len(r.private) }

// New returns a manager for cfg with the connector declarations decl (nil: no connector).
func New(cfg Config, decl *Declarations, opts Options) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tree, err := radix.New(radix.Config{TokensPerBlock: cfg.TokensPerBlock, StoreTokens: cfg.EnablePartialReuse})
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, decl: decl, opts: opts, t: cfg.TokensPerBlock, tree: tree,
		pages: make(map[radix.NodeID][]int32), reqs: make(map[RequestID]*request),
		bounds: make(map[RequestID]int), deferrals: make(map[RequestID]int),
	}
	m.backoff, m.alignment = EffectiveReuse(cfg, decl, opts.Draft)
	if opts.Draft && opts.Target != nil {
		m.alignment = lcm(m.alignment, opts.Target.alignment)
		if m.t%m.alignment != 0 {
			return nil, fmt.Errorf("%w: draft alignment %d does not divide tokens per block %d", ErrConfig, m.alignment, m.t)
		}
	}
	for _, p := range cfg.Pools {
		free := make([]int32, p.GPUSlots)
		for i := range free {
			free[i] = int32(p.GPUSlots - 1 - i)
		}
		m.free = append(m.free, free)
	}
	if cfg.HostSlots > 0 {
		m.host = newHostTier(cfg.HostSlots)
	}
	var warn string
	m.reserve, warn = ReservationApplies(cfg, decl, opts.Draft)
	if warn != "" {
		m.warnings = append(m.warnings, warn)
	}
	return m, nil
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// Warnings lists settings that were asked for but cannot apply.
func (m *Manager) Warnings() []string { return m.warnings }

// Reuse returns the backoff and alignment in effect.
func (m *Manager) Reuse() (backoff, alignment int) { return m.backoff, m.alignment }

// Reserving reports whether completion reservations are in force.
func (m *Manager) Reserving() bool { return m.reserve }

// FreePages returns the free pages of each pool.
func (m *Manager) FreePages() []int {
	out := make([]int, len(m.free))
	for i, f := range m.free {
		out[i] = len(f)
	}
	return out
}

// CachedBlocks returns the blocks in the GPU tree and how many of them are unreferenced.
func (m *Manager) CachedBlocks() (total, unreferenced int) {
	return m.tree.Len(), m.tree.Unreferenced()
}

// HostBlocks returns the blocks held by the host tier.
func (m *Manager) HostBlocks() int {
	if m.host == nil {
		return 0
	}
	return m.host.len()
}

// MatchResult is a local match.
type MatchResult struct {
	// Tokens is the reusable prefix, after backoff and alignment, short of the last token.
	Tokens int
	// GPUTokens and HostTokens split the raw match by tier.
	GPUTokens  int
	HostTokens int
	// RawTokens is the content-divergence depth over both tiers.
	RawTokens int
	// FirstNewBlock is the first block not wholly reused.
	FirstNewBlock int

	gpu       []radix.NodeID
	hostStart int
	keys      []keys.Hash
}

// Match returns the local reusable prefix of prompt. It changes nothing.
func (m *Manager) Match(prompt Prompt) (MatchResult, error) {
	if m.closed {
		return MatchResult{}, ErrShutdown
	}
	c, err := chain(prompt, m.t)
	if err != nil {
		return MatchResult{}, err
	}
	return m.match(prompt.Tokens, c)
}

func (m *Manager) match(prompt []int64, c *keys.Chain) (MatchResult, error) {
	ks := c.Hashes()
	tm, err := m.tree.Match(radix.Query{Keys: ks, Tokens: prompt, Scope: c.Seed()}, radix.MatchOptions{PartialReuse: m.cfg.EnablePartialReuse})
	if err != nil {
		return MatchResult{}, err
	}
	res := MatchResult{GPUTokens: tm.RawTokens, gpu: tm.Blocks, keys: ks, hostStart: len(tm.Blocks)}
	if m.host != nil && tm.RawTokens%m.t == 0 {
		for b := tm.RawTokens / m.t; b < len(ks) && m.host.has(ks[b]); b++ {
			res.HostTokens += m.t
		}
	}
	res.RawTokens = res.GPUTokens + res.HostTokens
	n := radix.Trim(res.RawTokens, m.backoff, m.alignment)
	if n >= len(prompt) {
		n = radix.Trim(len(prompt)-1, 0, m.alignment)
	}
	res.Tokens = max(n, 0)
	res.FirstNewBlock = res.Tokens / m.t
	return res, nil
}

// AllocResult describes an allocation.
type AllocResult struct {
	// ReusedTokens came from the local cache (GPU or onboarded from host).
	ReusedTokens int
	// OnboardedBlocks were brought back from the host tier.
	OnboardedBlocks int
	// Blocks is the number of blocks the request now holds.
	Blocks int
	// Epoch names this allocation; admission offers carry it.
	Epoch uint64
}

// Allocate gives request id pages for the first numTokens tokens of its sequence, reusing
// the local prefix of prompt. numTokens may run past the prompt (room for output). On error
// nothing is held.
func (m *Manager) Allocate(id RequestID, prompt Prompt, numTokens int) (AllocResult, error) {
	if m.closed {
		return AllocResult{}, ErrShutdown
	}
	if _, ok := m.reqs[id]; ok {
		return AllocResult{}, fmt.Errorf("%w: %d", ErrDuplicateRequest, id)
	}
	if len(prompt.Tokens) == 0 || numTokens < 1 {
		return AllocResult{}, fmt.Errorf("%w: prompt of %d tokens, %d tokens to allocate", ErrBadRequest, len(prompt.Tokens), numTokens)
	}
	tokens := append([]int64(nil), prompt.Tokens...)
	c, err := chain(Prompt{Tokens: tokens, Scope: prompt.Scope}, m.t)
	if err != nil {
		return AllocResult{}, err
	}
	ks := c.Hashes()
	mr, err := m.match(tokens, c)
	if err != nil {
		return AllocResult{}, err
	}
	m.epoch++
	r := &request{tokens: tokens, chain: c, keys: ks, epoch: m.epoch}
	m.reqs[id] = r
	fail := func(err error) (AllocResult, error) {
		m.drop(id, r)
		return AllocResult{}, err
	}
	whole := mr.Tokens / m.t
	nGPU := min(whole, mr.hostStart)
	for _, node := range mr.gpu[:nGPU] {
		if err := m.hold(id, r, node); err != nil {
			return fail(err)
		}
	}
	// Blocks being onboarded leave the host tier first, so evictions that refill it while
	// pages are found cannot drop them midway.
	for b := nGPU; b < whole; b++ {
		m.host.take(ks[b])
	}
	onboarded := 0
	for b := nGPU; b < whole; b++ {
		pages, err := m.takePages(id, r)
		if err != nil {
			return fail(err)
		}
		node, err := m.cacheBlock(r, b, pages)
		if err != nil {
			return fail(err)
		}
		if err := m.hold(id, r, node); err != nil {
			return fail(err)
		}
		onboarded++
	}
	r.reused = mr.Tokens
	r.computed = mr.Tokens
	if err := m.grow(id, r, max(numTokens, mr.Tokens+1)); err != nil {
		return fail(err)
	}
	return AllocResult{ReusedTokens: mr.Tokens, OnboardedBlocks: onboarded, Blocks: r.held(), Epoch: r.epoch}, nil
}

// Grow extends request id's pages to cover numTokens tokens. On error the request keeps
// what it held.
func (m *Manager) Grow(id RequestID, numTokens int) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	return m.grow(id, r, numTokens)
}

func (m *Manager) grow(id RequestID, r *request, numTokens int) error {
	need := (numTokens + m.t - 1) / m.t
	start := len(r.private)
	for r.held() < need {
		pages, err := m.takePages(id, r)
		if err != nil {
			for _, p := range r.private[start:] {
				m.putPages(p)
			}
			r.private = r.private[:start]
			return err
		}
		r.private = append(r.private, pages)
	}
	return nil
}

// headroom reports whether request id may take one more slot without eating into another
// admitted request's reservation.
func (m *Manager) headroom(id RequestID, r *request) bool {
	if !m.reserve {
		return true
	}
	if b, ok := m.bounds[id]; ok && r.held() < b {
		return true
	}
	others := m.outstanding(id)
	avail := m.tree.Unreferenced()
	for _, f := range m.free {
		if len(f)+avail-others < 1 {
			return false
		}
	}
	return true
}

// takePages takes one page in every pool, evicting cached blocks as needed.
func (m *Manager) takePages(id RequestID, r *request) ([]int32, error) {
	if !m.headroom(id, r) {
		return nil, fmt.Errorf("%w: request %d would take pages reserved for others", ErrOutOfPages, id)
	}
	for {
		short := false
		for _, f := range m.free {
			if len(f) == 0 {
				short = true
			}
		}
		if !short {
			break
		}
		if m.tree.Evict(1, m.onEvict) == 0 {
			return nil, fmt.Errorf("%w: request %d", ErrOutOfPages, id)
		}
	}
	pages := make([]int32, len(m.free))
	for i, f := range m.free {
		pages[i] = f[len(f)-1]
		m.free[i] = f[:len(f)-1]
	}
	return pages, nil
}

func (m *Manager) putPages(pages []int32) {
	for i, p := range pages {
		m.free[i] = append(m.free[i], p)
	}
}

func (m *Manager) onEvict(node radix.NodeID) {
	m.putPages(m.pages[node])
	delete(m.pages, node)
	if m.host != nil {
		if info, err := m.tree.Info(node); err == nil && info.NumTokens == m.t {
			m.host.put(info.Key)
		}
	}
}

// hold pins a cached block for the request; it counts against the request's bound.
func (m *Manager) hold(id RequestID, r *request, node radix.NodeID) error {
	if info, err := m.tree.Info(node); err == nil && info.Refs == 0 && !m.headroom(id, r) {
		return fmt.Errorf("%w: request %d would take pages reserved for others", ErrOutOfPages, id)
	}
	if err := m.tree.Acquire(node); err != nil {
		return err
	}
	r.shared = append(r.shared, node)
	return nil
}

// cacheBlock inserts full block b of r with pages under the request's last shared block and
// returns the node that now stands for it. The pages are the tree's afterwards.
func (m *Manager) cacheBlock(r *request, b int, pages []int32) (radix.NodeID, error) {
	parent := radix.Root
	if b > 0 {
		parent = r.shared[b-1]
	}
	node, out, err := m.tree.Insert(parent, radix.Block{Key: r.keys[b], Tokens: r.tokens[b*m.t : (b+1)*m.t], Scope: r.chain.Seed()})
	if err != nil {
		m.putPages(pages)
		return 0, err
	}
	m.adopt(node, out, pages)
	return node, nil
}

// adopt settles page ownership after an insertion: a new node takes the pages; a longer
// block that replaced a partial one keeps the larger page; otherwise the pages go back.
func (m *Manager) adopt(node radix.NodeID, out radix.Outcome, pages []int32) {
	switch out {
	case radix.Inserted:
		m.pages[node] = pages
	case radix.Replaced:
		m.putPages(m.pages[node])
		m.pages[node] = pages
	default:
		m.putPages(pages)
	}
}

// Commit records that request id has computed tokens (its sequence from the start) and
// publishes the full blocks among them to the local cache.
func (m *Manager) Commit(id RequestID, tokens []int64) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	if len(tokens) < r.computed || len(tokens) > r.held()*m.t {
		return fmt.Errorf("%w: commit of %d tokens, request has %d computed and pages for %d", ErrBadRequest, len(tokens), r.computed, r.held()*m.t)
	}
	for i := 0; i < min(len(r.tokens), len(tokens)); i++ {
		if r.tokens[i] != tokens[i] {
			return fmt.Errorf("%w: committed token %d differs from the prompt", ErrBadRequest, i)
		}
	}
	if len(tokens) > len(r.tokens) {
		r.tokens = append(r.tokens, tokens[len(r.tokens):]...)
		if _, err := r.chain.Extend(r.tokens); err != nil {
			return err
		}
		r.keys = r.chain.Hashes()
	}
	r.computed = len(tokens)
	for b := len(r.shared); b < len(tokens)/m.t; b++ {
		pages := r.private[0]
		r.private = r.private[1:]
		node, err := m.cacheBlock(r, b, pages)
		if err != nil {
			return err
		}
		if err := m.tree.Acquire(node); err != nil {
			return err
		}
		r.shared = append(r.shared, node)
	}
	return nil
}

// Free ends request id: its partial last block is offered to the cache when partial reuse is
// on, its pages are released and its reservation dropped.
func (m *Manager) Free(id RequestID) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	if tail := r.computed % m.t; m.cfg.EnablePartialReuse && tail > 0 && len(r.private) > 0 {
		b := len(r.shared)
		parent, pk := radix.Root, r.chain.Seed()
		if b > 0 {
			parent = r.shared[b-1]
			pk = r.keys[b-1]
		}
		toks := r.tokens[b*m.t : r.computed]
		key, err := partialKey(pk, toks)
		var node radix.NodeID
		var out radix.Outcome
		if err == nil {
			node, out, err = m.tree.Insert(parent, radix.Block{Key: key, Tokens: toks, Scope: r.chain.Seed()})
		}
		if err == nil {
			m.adopt(node, out, r.private[0])
			r.private = r.private[1:]
		}
	}
	m.drop(id, r)
	return nil
}

// Revert drops request id's allocation without publishing anything more, as when a first
// chunk is given back or a load failed; the request may be allocated again.
func (m *Manager) Revert(id RequestID) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	m.drop(id, r)
	return nil
}

func (m *Manager) drop(id RequestID, r *request) {
	if len(r.shared) > 0 {
		// Each node was acquired once by this request.
		_ = m.tree.Release(r.shared...)
	}
	for _, p := range r.private {
		m.putPages(p)
	}
	delete(m.reqs, id)
	delete(m.bounds, id)
}

// Shutdown releases every allocation and reservation; later calls fail with ErrShutdown.
func (m *Manager) Shutdown() {
	for id, r := range m.reqs {
		m.drop(id, r)
	}
	clear(m.bounds)
	m.closed = true
}

func (m *Manager) req(id RequestID) (*request, error) {
	if m.closed {
		return nil, ErrShutdown
	}
	r, ok := m.reqs[id]
	if !ok {
		return nil, fmt.Errorf("%w: %d", ErrUnknownRequest, id)
	}
	return r, nil
}

// Held returns the number of blocks request id holds.
func (m *Manager) Held(id RequestID) (int, error) {
	r, err := m.req(id)
	if err != nil {
		return 0, err
	}
	return r.held(), nil
}
