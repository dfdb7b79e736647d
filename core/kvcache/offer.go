package kvcache

import "fmt"

// Offer is a connector's admission-time answer for one allocation of a request.
type Offer struct {
	// Epoch is the allocation epoch the offer was made for (AllocResult.Epoch).
	Epoch uint64
	// Tokens the connector offers from the end of the local match.
	Tokens int
	// Async means the request parks while the offer loads.
	Async bool
}

// SetOffer stores an offer on request id. An offer for another allocation epoch is refused
// with ErrStaleOffer; a repeated answer for the same epoch replaces the earlier one.
func (m *Manager) SetOffer(id RequestID, o Offer) error {
	r, err := m.req(id)
	if err != nil {
		return err
	}
	if o.Epoch != r.epoch {
		return fmt.Errorf("%w: offer for epoch %d, request %d is at %d", ErrStaleOffer, o.Epoch, id, r.epoch)
	}
	if o.Tokens < 0 || o.Tokens%m.t != 0 {
		return fmt.Errorf("%w: offer of %d tokens is not whole blocks of %d", ErrBadRequest, o.Tokens, m.t)
	}
	r.offer = &o
	return nil
}

// TakeOffer returns and clears request id's offer when it still matches the allocation.
func (m *Manager) TakeOffer(id RequestID) (Offer, bool) {
	r, ok := m.reqs[id]
	if !ok || r.offer == nil || r.offer.Epoch != r.epoch {
		return Offer{}, false
	}
	o := *r.offer
	r.offer = nil
	return o, true
}

// CoverOutcome says how an admission offer was placed.
type CoverOutcome uint8

const (
	// Covered means the allocation grew to the shifted chunk window; the whole offer is honoured.
	Covered CoverOutcome = iota + 1
	// Deferred means the pool could not cover the window, so the first chunk was released and the
	// request waits for a later pass.
	Deferred
	// Shrunk means the deferrals ran out (or the request just preempted another); only the whole
	// blocks its pages hold are loaded, the rest is recomputed.
	Shrunk
)

// CoverResult is the placement of an offer.
type CoverResult struct {
	Outcome CoverOutcome
	// Tokens of the offer honoured.
	Tokens int
	// Deferrals so far for this request.
	Deferrals int
}

// CoverAdmissionOffer grows request id's allocation so that a chunk of chunkTokens starts
// after the offered tokens. When the pools cannot cover it the chunk is deferred, up to
// max_offer_deferrals passes or unless the request just preempted another one for pages.
func (m *Manager) CoverAdmissionOffer(id RequestID, chunkTokens int, justPreempted bool) (CoverResult, error) {
	r, err := m.req(id)
	if err != nil {
		return CoverResult{}, err
	}
	if r.offer == nil || r.offer.Epoch != r.epoch {
		return CoverResult{}, fmt.Errorf("%w: request %d has no offer for epoch %d", ErrStaleOffer, id, r.epoch)
	}
	if chunkTokens < 1 {
		return CoverResult{}, fmt.Errorf("%w: chunk of %d tokens", ErrBadRequest, chunkTokens)
	}
	o := *r.offer
	end := min(r.reused+o.Tokens+chunkTokens, len(r.tokens))
	if err := m.grow(id, r, end); err == nil {
		delete(m.deferrals, id)
		return CoverResult{Outcome: Covered, Tokens: o.Tokens}, nil
	}
	maxDefer := 0
	if m.cfg.AdmissionQuery != nil {
		maxDefer = m.cfg.AdmissionQuery.MaxOfferDeferrals
	}
	if d := m.deferrals[id]; d < maxDefer && !justPreempted {
		m.deferrals[id] = d + 1
		m.drop(id, r)
		return CoverResult{Outcome: Deferred, Deferrals: d + 1}, nil
	}
	d := m.deferrals[id]
	delete(m.deferrals, id)
	// The request's pages hold whole blocks; the offer starts on a block boundary.
	holds := max(r.held()*m.t-r.reused, 0)
	honoured := min(o.Tokens, holds/m.t*m.t)
	r.offer.Tokens = honoured
	return CoverResult{Outcome: Shrunk, Tokens: honoured, Deferrals: d}, nil
}

// Pass is one scheduling pass's token budget and request slots.
type Pass struct {
	budget       int
	slots        int
	uncharged    int
	maxUncharged int
}

// BeginPass starts a scheduling pass. attentionDP turns uncharged parks off with admission
// queries.
func (m *Manager) BeginPass(tokenBudget, maxRequests int, attentionDP bool) *Pass {
	p := &Pass{budget: tokenBudget, slots: maxRequests}
	if AdmissionQueryApplies(m.cfg, m.decl, attentionDP || m.opts.AttentionDP) {
		p.maxUncharged = m.cfg.AdmissionQuery.MaxUnchargedParks
	}
	return p
}

// Admit charges a chunk to the pass. A chunk that will park is admitted without a token
// charge while the pass has uncharged parks left; every admitted chunk takes a request slot.
func (p *Pass) Admit(chunkTokens int, willPark bool) (charged int, ok bool) {
	if p.slots < 1 {
		return 0, false
	}
	if willPark && p.uncharged < p.maxUncharged {
		p.uncharged++
		p.slots--
		return 0, true
	}
	if chunkTokens > p.budget {
		return 0, false
	}
	p.budget -= chunkTokens
	p.slots--
	return chunkTokens, true
}

// Budget returns the tokens and request slots left.
func (p *Pass) Budget() (tokens, slots int) { return p.budget, p.slots }
