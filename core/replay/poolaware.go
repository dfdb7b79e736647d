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
	T := o.p.TokensPerBlock
	pr := prepare(o.t.Format, q, T)
	tokens := o.tokens(q, pr)
	recipe := keys.Recipe{Format: keys.FormatTRTLLM, TokensPerBlock: T,
		Namespace: keys.Namespace{ModelKey: "replay", WorldSize: 1, AttentionDP: o.c.Ranks > 1},
		Groups:    []keys.LayerGroupPages{{Group: 0, BytesPerPage: uint64(o.p.SimPageBytes)}}}
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
	status := o.emb.BatchIsExist(o.ctx, all)
	held := 0 // blocks
	for b := range hashes {
		complete := len(status) == len(all)
		for i := b * per; complete && i < (b+1)*per; i++ {
			complete = status[i] == 1
		}
		if !complete {
			break
		}
		held++
	}
	perBlock := T
	if o.t.Format == FormatMooncake {
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
