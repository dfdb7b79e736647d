package disagg

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvctl/kvctl/core/config"
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/probe"
	"github.com/kvctl/kvctl/core/router"
)

// upstream is one context or generation server.
type upstream struct {
	addr     string // host:port
	role     string
	inFlight atomic.Int64
	tokens   atomic.Int64
}

// routeInfo is what a router knows of a request.
type routeInfo struct {
	id             string
	conversationID string
	promptTokens   int     // exact for token-id prompts, estimated for text
	tokenIDs       []int64 // nil for a text prompt
}

// reservation is a routing decision's hold on a server; release is idempotent.
type reservation struct {
	up      *upstream
	once    sync.Once
	release func()
}

func (r *reservation) done() {
	r.once.Do(func() {
		if r.release != nil {
			r.release()
		}
	})
}

// picker chooses a server for a leg. exclude, when set, is avoided if any other server exists.
type picker interface {
	pick(ctx context.Context, ri *routeInfo, exclude *upstream) (*reservation, error)
}

func newPicker(rc config.DisaggRouter, ups []*upstream, m *metrics, lookup PoolLookup) (picker, error) {
	switch rc.Type {
	case "", config.RouterRoundRobin:
		return &roundRobin{ups: ups}, nil
	case config.RouterLoadBalancing:
		return &leastLoaded{ups: ups, useTokens: rc.UseTokens}, nil
	case config.RouterWorkAware, config.RouterPoolAware:
		policy := router.PolicyWorkAware
		if rc.Type == config.RouterPoolAware {
			policy = router.PolicyPoolAware
		}
		rt, err := router.New(router.Config{Policy: policy, Ranks: len(ups), MaxActiveRequests: int(rc.MaxActiveRequests)})
		if err != nil {
			return nil, err
		}
		w := &workAware{ups: ups, rt: rt, wake: make(chan struct{}), m: m}
		if rc.Type == config.RouterPoolAware {
			if lookup == nil {
				l, err := NewPoolLookup(rc)
				if err != nil {
					return nil, err
				}
				lookup = l
			}
			w.lookup = lookup
			w.lookupTimeout = time.Duration(rc.LookupTimeoutMs) * time.Millisecond
			if w.lookupTimeout <= 0 {
				w.lookupTimeout = config.DefaultPoolLookupTimeoutMs * time.Millisecond
			}
		}
		return w, nil
	}
	return nil, fmt.Errorf("router type %q is not supported", rc.Type)
}

func hold(up *upstream, tokens int) *reservation {
	up.inFlight.Add(1)
	up.tokens.Add(int64(tokens))
	return &reservation{up: up, release: func() {
		up.inFlight.Add(-1)
		up.tokens.Add(-int64(tokens))
	}}
}

type roundRobin struct {
	ups  []*upstream
	next atomic.Uint64
}

func (r *roundRobin) pick(_ context.Context, ri *routeInfo, exclude *upstream) (*reservation, error) {
	for range 2 {
		up := r.ups[(r.next.Add(1)-1)%uint64(len(r.ups))]
		if up != exclude || len(r.ups) == 1 {
			return hold(up, ri.promptTokens), nil
		}
	}
	return hold(r.ups[0], ri.promptTokens), nil
}

type leastLoaded struct {
	ups       []*upstream
	useTokens bool
	mu        sync.Mutex
}

func (l *leastLoaded) pick(_ context.Context, ri *routeInfo, exclude *upstream) (*reservation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *upstream
	var bestLoad int64
	for _, up := range l.ups {
		if up == exclude && len(l.ups) > 1 {
			continue
		}
		load := up.inFlight.Load()
		if l.useTokens {
			load = up.tokens.Load()
		}
		if best == nil || load < bestLoad {
			best, bestLoad = up, load
		}
	}
	return hold(best, ri.promptTokens), nil
}

// workAware runs core/router's work-aware (or pool-aware) policy across context servers. A
// request that no server can take under the cap waits for a release, bounded by ctx.
type workAware struct {
	ups []*upstream
	m   *metrics

	mu   sync.Mutex
	rt   *router.Router
	wake chan struct{} // closed and replaced on every release

	lookup        PoolLookup
	lookupTimeout time.Duration
}

func (w *workAware) pick(ctx context.Context, ri *routeInfo, _ *upstream) (*reservation, error) {
	req := router.Request{ID: ri.id, ConversationID: ri.conversationID, PromptTokens: max(ri.promptTokens, 1), Rank: router.Unplaced}
	if w.lookup != nil {
		req.PoolUncached, req.PoolKnown = w.poolEstimate(ctx, ri)
	}
	for {
		w.mu.Lock()
		pl, err := w.rt.Route([]router.Request{req})
		if err != nil {
			w.mu.Unlock()
			return nil, err
		}
		if pl[0].Rank != router.Unplaced {
			up := w.ups[pl[0].Rank]
			w.mu.Unlock()
			r := hold(up, ri.promptTokens)
			inner := r.release
			r.release = func() {
				inner()
				w.mu.Lock()
				_ = w.rt.Finished(ri.id)
				close(w.wake)
				w.wake = make(chan struct{})
				w.mu.Unlock()
			}
			return r, nil
		}
		wake := w.wake
		w.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, fmt.Errorf("every context server is at max_num_active_requests: %w", context.Cause(ctx))
		}
	}
}

// poolEstimate asks the pool which of the prompt's blocks it holds, within the lookup timeout.
func (w *workAware) poolEstimate(ctx context.Context, ri *routeInfo) (int, bool) {
	if ri.tokenIDs == nil {
		w.m.lookups.WithLabelValues(LookupNoTokenIDs).Inc()
		return 0, false
	}
	lctx, cancel := context.WithTimeout(ctx, w.lookupTimeout)
	defer cancel()
	held, err := w.lookup.CachedTokens(lctx, ri.tokenIDs)
	switch {
	case err == nil:
		w.m.lookups.WithLabelValues(LookupHit).Inc()
		return max(len(ri.tokenIDs)-held, 0), true
	case errors.Is(err, errTooLong):
		w.m.lookups.WithLabelValues(LookupOverTokenCaps).Inc()
	case lctx.Err() != nil:
		w.m.lookups.WithLabelValues(LookupTimeout).Inc()
	default:
		w.m.lookups.WithLabelValues(LookupError).Inc()
	}
	return 0, false
}

// PoolLookup tells how many leading prompt tokens the shared pool holds. Implementations are
// safe for concurrent use and honour ctx's deadline.
type PoolLookup interface {
	CachedTokens(ctx context.Context, tokens []int64) (int, error)
}

var errTooLong = errors.New("prompt has more blocks than a lookup checks")

// maxLookupBlocks bounds the keys one routing decision asks the pool about.
const maxLookupBlocks = 4096

// keyLookup derives a prompt's block keys as kvctl hash does and asks the pool's admin API
// which are present, as probe-pool does; the hit is the leading run of complete blocks.
type keyLookup struct {
	target *probe.Target
	recipe keys.Recipe
}

// NewPoolLookup builds the pool_aware lookup of a router config: the pool's admin address
// and the key layout.
func NewPoolLookup(rc config.DisaggRouter) (PoolLookup, error) {
	format := keys.Format(rc.KeyFormat)
	if rc.KeyFormat != "" {
		f, err := keys.ParseFormat(rc.KeyFormat)
		if err != nil {
			return nil, err
		}
		format = f
	}
	recipe := keys.Recipe{Format: format, TokensPerBlock: int(rc.TokensPerBlock),
		Namespace: keys.Namespace{Namespace: rc.Namespace, ModelKey: rc.ModelKey, WorldSize: int(max(rc.WorldSize, 1))}}
	if err := recipe.ChainConfig(keys.Scope{}).Validate(); err != nil {
		return nil, err
	}
	if err := recipe.Namespace.Validate(); err != nil {
		return nil, err
	}
	var groups []keys.LayerGroupPages
	for _, s := range rc.LayerGroups {
		g, b, _ := strings.Cut(s, ":")
		gi, err1 := strconv.Atoi(g)
		bi, err2 := strconv.ParseUint(b, 10, 64)
		if err1 != nil || err2 != nil || bi == 0 {
			return nil, fmt.Errorf("layer group %q: want group:bytes_per_page", s)
		}
		groups = append(groups, keys.LayerGroupPages{Group: gi, BytesPerPage: bi})
	}
	if len(groups) == 0 {
		return nil, errors.New("pool_aware needs layer_groups")
	}
	t, err := probe.NewTarget(rc.Pool, time.Duration(max(rc.LookupTimeoutMs, 1))*time.Millisecond)
	if err != nil {
		return nil, err
	}
	recipe.Groups = groups
	return &keyLookup{target: t, recipe: recipe}, nil
}

// CachedTokens implements PoolLookup.
func (k *keyLookup) CachedTokens(ctx context.Context, tokens []int64) (int, error) {
	if len(tokens)/k.recipe.TokensPerBlock > maxLookupBlocks {
		return 0, errTooLong
	}
	chain, err := k.recipe.NewChain(keys.Scope{})
	if err != nil {
		return 0, err
	}
	hashes, err := chain.Extend(tokens)
	if err != nil {
		return 0, err
	}
	all := k.recipe.AppendLookupKeys(nil, hashes...)
	per := make([]int, len(hashes))
	for i := range per {
		per[i] = k.recipe.LookupKeysPerBlock()
	}
	present, err := k.target.Exists(ctx, all, false)
	if err != nil {
		return 0, err
	}
	held, j := 0, 0
	for _, n := range per {
		complete := true
		for range n {
			complete = complete && present[j]
			j++
		}
		if !complete {
			break
		}
		held += k.recipe.TokensPerBlock
	}
	return held, nil
}
