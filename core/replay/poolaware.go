package replay

import (
	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/core/router"
)

// poolUncached is the pool-aware router's estimate of a request's prefill, in trace tokens like
// the other policies' estimates: the tokens past the leading run of blocks whose every key the
// pool holds (a Mooncake trace block of 512 tokens is one replay block), asked of the pool as a
// connector's lookup asks it (the rank keys of attention DP are the same on every rank), but
// without counting as a connector lookup. ok is false when the keys cannot be derived; the
// router then falls back to the work-aware estimate.
func (o *offline) poolUncached(q Request) (int, bool) {
	exists := func(keys []string) ([]bool, error) {
		status := o.emb.BatchIsExist(o.ctx, keys)
		out := make([]bool, len(status))
		for i, s := range status {
			out[i] = s == 1
		}
		return out, nil
	}
	return poolUncachedOf(o.t.Format, o.p, q, o.c.Ranks > 1, exists)
}

// poolUncachedOf is the pool-aware estimate of q's prefill for a replay whose pool answers
// exists; the offline replay asks its embedded pool, a live replay the daemon's admin API.
func poolUncachedOf(format string, p Params, q Request, attentionDP bool, exists func([]string) ([]bool, error)) (int, bool) {
	T := p.TokensPerBlock
	pr := prepare(format, q, T)
	tokens := appendTokens(nil, format, p.Seed, T, q, pr)
	recipe := keys.Recipe{Format: keys.FormatTRTLLM, TokensPerBlock: T,
		Namespace: keys.Namespace{ModelKey: "replay", WorldSize: 1, AttentionDP: attentionDP},
		Groups:    []keys.LayerGroupPages{{Group: 0, BytesPerPage: uint64(p.SimPageBytes)}}}
	chain, err := recipe.NewChain(q.Scope)
	if err != nil {
		return 0, false
	}
	hashes, err := chain.Extend(tokens)
	if err != nil {
		return 0, false
	}
	all := recipe.AppendLookupKeys(nil, hashes...)
	if len(all) == 0 {
		return q.InputLength, true
	}
	per := len(all) / len(hashes)
	status, err := exists(all)
	if err != nil {
		return 0, false
	}
	held := 0 // blocks
	for b := range hashes {
		complete := len(status) == len(all)
		for i := b * per; complete && i < (b+1)*per; i++ {
			complete = status[i]
		}
		if !complete {
			break
		}
		held++
	}
	perBlock := T
	if format == FormatMooncake {
		perBlock = TraceBlockTokens
	}
	return max(q.InputLength-held*perBlock, 0), true
}

// routerRequest is the router's view of q, with the pool's answer for the pool-aware policy.
func (o *offline) routerRequest(q Request) router.Request {
	rq := router.Request{ID: q.ID, ConversationID: q.ConversationID, PromptTokens: q.InputLength, Rank: router.Unplaced}
	if o.c.Router == router.PolicyPoolAware {
		rq.PoolUncached, rq.PoolKnown = o.poolUncached(q)
	}
	return rq
}
