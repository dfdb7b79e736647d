package router

import (
	"container/list"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Policies.
const (
	// PolicyWorkAware is the seed's work-aware router: estimates are prompt growth per
	// conversation.
	PolicyWorkAware = "work-aware"
	// PolicyPromptLength balances by whole prompt length, TensorRT-LLM's default.
	PolicyPromptLength = "prompt-length"
	// PolicyPoolAware estimates a request's prefill as the prompt tokens the shared pool does
	// not hold (Request.PoolUncached), and falls back to the work-aware estimate when the pool
	// was not asked or did not answer (PoolKnown false).
	PolicyPoolAware = "pool-aware"
)

// Policies lists the policies in help order.
var Policies = []string{PolicyWorkAware, PolicyPromptLength, PolicyPoolAware}

// ParsePolicy returns the policy name spells, in either spelling: work-aware as the flags
// write it, or work_aware as TensorRT-LLM's YAML does.
func ParsePolicy(name string) (string, error) {
	for _, p := range Policies {
		if name == p || name == strings.ReplaceAll(p, "-", "_") {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: policy %q: want one of %s (or with underscores, as TensorRT-LLM's YAML writes them)", ErrConfig, name, strings.Join(Policies, ", "))
}

// Defaults for the LRU table bounds.
const (
	DefaultConversationCapacity = 1 << 16
	DefaultRequestCapacity      = 1 << 16
)

// Unplaced is the rank Route returns for a request no rank can take under the cap.
const Unplaced = -1

var (
	// ErrConfig reports an invalid router configuration.
	ErrConfig = errors.New("invalid router config")
	// ErrUnknownRequest reports a request id the router does not hold.
	ErrUnknownRequest = errors.New("unknown request")
)

// Config configures a Router.
type Config struct {
	// Policy is PolicyWorkAware or PolicyPromptLength.
	Policy string
	// Ranks is the number of attention-DP ranks.
	Ranks int
	// MaxActiveRequests caps the requests a rank holds; 0 means no cap.
	MaxActiveRequests int
	// ConversationCapacity and RequestCapacity bound the LRU tables; 0 takes the defaults.
	ConversationCapacity int
	RequestCapacity      int
}

// Request is one new request.
type Request struct {
	ID string
	// ConversationID groups the turns of a conversation; "" when none.
	ConversationID string
	// PromptTokens is the prompt length.
	PromptTokens int
	// ParentID, when set, names the n>1 parent whose estimate this child inherits.
	ParentID string
	// Rank, when not Unplaced, places the request explicitly on that rank.
	Rank int
	// PoolUncached is the number of prompt tokens the pool does not hold, read by
	// PolicyPoolAware when PoolKnown is set.
	PoolUncached int
	PoolKnown    bool
}

// Placement is where Route put a request and what it charged.
type Placement struct {
	ID   string
	Rank int // Unplaced when no rank is below the cap
	// Estimate is the request's prefill estimate, charged to its rank. It is also published
	// with the request as its uncached-prefill count (seed commit 20: TensorRT-LLM's
	// py_uncached_prefill_tokens), which the V2 scheduler's long-prefill demotion reads; kvctl
	// replay's scheduler model does (--set long_prefill_tokens).
	Estimate int
}

// RankState is one rank's current load.
type RankState struct {
	Rank   int `json:"rank"`
	Load   int `json:"load"`
	Active int `json:"active"`
}

type held struct {
	rank     int
	estimate int
	context  bool
}

// Router places requests on ranks.
type Router struct {
	cfg    Config
	load   []int
	active []int
	held   map[string]*held
	convs  *lru[string, int] // conversation -> previous prompt length
	ests   *lru[string, int] // request -> estimate, for children
	// unplaced keeps the estimate of a request Route left Unplaced, so that routing it again
	// charges the estimate made in routing order rather than re-estimating it against the
	// conversation length it recorded itself.
	unplaced *lru[string, int]
}

// New returns a router for cfg.
func New(cfg Config) (*Router, error) {
	if cfg.Policy == "" {
		cfg.Policy = PolicyWorkAware
	}
	if cfg.ConversationCapacity == 0 {
		cfg.ConversationCapacity = DefaultConversationCapacity
	}
	if cfg.RequestCapacity == 0 {
		cfg.RequestCapacity = DefaultRequestCapacity
	}
	var errs []error
	if p, err := ParsePolicy(cfg.Policy); err != nil {
		errs = append(errs, err)
	} else {
		cfg.Policy = p
	}
	if cfg.Ranks < 1 {
		errs = append(errs, fmt.Errorf("%w: ranks %d: want at least 1", ErrConfig, cfg.Ranks))
	}
	if cfg.MaxActiveRequests < 0 {
		errs = append(errs, fmt.Errorf("%w: max active requests %d is negative", ErrConfig, cfg.MaxActiveRequests))
	}
	if cfg.ConversationCapacity < 1 || cfg.RequestCapacity < 1 {
		errs = append(errs, fmt.Errorf("%w: table capacities must be positive", ErrConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Router{
		cfg:    cfg,
		load:   make([]int, cfg.Ranks),
		active: make([]int, cfg.Ranks),
		held:   map[string]*held{},
		convs:  newLRU[string, int](cfg.ConversationCapacity),
		ests:   newLRU[string, int](cfg.RequestCapacity),

		unplaced: newLRU[string, int](cfg.RequestCapacity),
	}, nil
}

// Config returns the configuration in force, defaults filled.
func (r *Router) Config() Config { return r.cfg }

// Estimate is the prefill estimate of req given the conversation table as it stands; it
// changes nothing.
func (r *Router) Estimate(req Request) int {
	if r.cfg.Policy == PolicyPromptLength {
		return max(req.PromptTokens, 1)
	}
	if req.ParentID != "" {
		if e, ok := r.ests.peek(req.ParentID); ok {
			return e
		}
	}
	if r.cfg.Policy == PolicyPoolAware && req.PoolKnown {
		return max(req.PoolUncached, 1)
	}
	growth := req.PromptTokens
	if req.ConversationID != "" {
		if prev, ok := r.convs.peek(req.ConversationID); ok && req.PromptTokens >= prev {
			growth = req.PromptTokens - prev
		}
	}
	return max(growth, 1)
}

// Route places a batch of new requests. Every request is estimated once in routing order and
// its conversation's prompt length recorded; explicitly placed ones are charged to their rank
// first, then the rest go largest first to the least-loaded rank below the cap. A request no
// rank can take comes back Unplaced, uncharged; route it again later. Placements are in the
// order of reqs.
func (r *Router) Route(reqs []Request) ([]Placement, error) {
	out := make([]Placement, len(reqs))
	seen := make(map[string]bool, len(reqs))
	for i, q := range reqs {
		if q.ID == "" {
			return nil, fmt.Errorf("request %d of the batch has no id", i)
		}
		if seen[q.ID] || r.held[q.ID] != nil {
			return nil, fmt.Errorf("request %s is already routed", q.ID)
		}
		seen[q.ID] = true
		if q.Rank != Unplaced && (q.Rank < 0 || q.Rank >= r.cfg.Ranks) {
			return nil, fmt.Errorf("request %s placed on rank %d of %d", q.ID, q.Rank, r.cfg.Ranks)
		}
	}
	for i, q := range reqs {
		if e, ok := r.unplaced.peek(q.ID); ok {
			// Estimated when it was first routed; its conversation was recorded then.
			out[i] = Placement{ID: q.ID, Rank: Unplaced, Estimate: e}
			continue
		}
		e := r.Estimate(q)
		out[i] = Placement{ID: q.ID, Rank: Unplaced, Estimate: e}
		r.ests.put(q.ID, e)
		if q.ConversationID != "" && q.ParentID == "" {
			r.convs.put(q.ConversationID, q.PromptTokens)
		}
	}
	var free []int
	for i, q := range reqs {
		if q.Rank != Unplaced {
			out[i].Rank = q.Rank
			r.charge(q.ID, q.Rank, out[i].Estimate)
			continue
		}
		free = append(free, i)
	}
	slices.SortStableFunc(free, func(a, b int) int { return out[b].Estimate - out[a].Estimate })
	for _, i := range free {
		best := Unplaced
		for k := range r.cfg.Ranks {
			if r.cfg.MaxActiveRequests > 0 && r.active[k] >= r.cfg.MaxActiveRequests {
				continue
			}
			if best == Unplaced || r.load[k] < r.load[best] {
				best = k
			}
		}
		if best == Unplaced {
			r.unplaced.put(reqs[i].ID, out[i].Estimate)
			continue
		}
		out[i].Rank = best
		r.charge(reqs[i].ID, best, out[i].Estimate)
	}
	return out, nil
}

func (r *Router) charge(id string, rank, estimate int) {
	r.unplaced.remove(id)
	r.held[id] = &held{rank: rank, estimate: estimate, context: true}
	r.load[rank] += estimate
	r.active[rank]++
}

// ContextDone records that request id left the context phase: its estimate leaves its rank's
// load. Calling it twice is harmless.
func (r *Router) ContextDone(id string) error {
	h := r.held[id]
	if h == nil {
		return fmt.Errorf("%w: %s", ErrUnknownRequest, id)
	}
	if h.context {
		h.context = false
		r.load[h.rank] -= h.estimate
	}
	return nil
}

// Finished records that request id finished: it leaves the context phase if it had not, and
// frees its active slot.
func (r *Router) Finished(id string) error {
	if err := r.ContextDone(id); err != nil {
		return err
	}
	h := r.held[id]
	r.active[h.rank]--
	delete(r.held, id)
	return nil
}

// Ranks returns every rank's load and active count.
func (r *Router) Ranks() []RankState {
	out := make([]RankState, r.cfg.Ranks)
	for k := range out {
		out[k] = RankState{Rank: k, Load: r.load[k], Active: r.active[k]}
	}
	return out
}

// TableSizes returns the number of entries in the conversation and request tables.
func (r *Router) TableSizes() (conversations, requests int) { return r.convs.len(), r.ests.len() }

// lru is a bounded map that drops its least recently written entry.
type lru[K comparable, V any] struct {
	cap   int
	order *list.List
	items map[K]*list.Element
}

type entry[K comparable, V any] struct {
	k K
	v V
}

func newLRU[K comparable, V any](capacity int) *lru[K, V] {
	return &lru[K, V]{cap: capacity, order: list.New(), items: map[K]*list.Element{}}
}

func (l *lru[K, V]) peek(k K) (V, bool) {
	if e, ok := l.items[k]; ok {
		return e.Value.(*entry[K, V]).v, true
	}
	var zero V
	return zero, false
}

func (l *lru[K, V]) put(k K, v V) {
	if e, ok := l.items[k]; ok {
		e.Value.(*entry[K, V]).v = v
		l.order.MoveToFront(e)
		return
	}
	l.items[k] = l.order.PushFront(&entry[K, V]{k, v})
	for l.order.Len() > l.cap {
		old := l.order.Back()
		l.order.Remove(old)
		delete(l.items, old.Value.(*entry[K, V]).k)
	}
}

func (l *lru[K, V]) remove(k K) {
	if e, ok := l.items[k]; ok {
		l.order.Remove(e)
		delete(l.items, k)
	}
}

func (l *lru[K, V]) len() int { return l.order.Len() }
