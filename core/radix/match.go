package radix

import (
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// Query is a token sequence to match.
type Query struct {
	// Keys are the chain keys of the sequence's full blocks, in order. A key may be left out
	// for trailing blocks; the walk stops where the keys end.
	Keys []keys.Hash
	// Tokens are the sequence's tokens. They are optional: without them only whole blocks
	// match, and the lookup length is len(Keys)·T.
	Tokens []int64
	// Scope is the reuse scope the keys were chained from (Block.Scope): a partial match
	// considers only blocks of the same scope.
	Scope keys.Hash
}

// PruneRules are the coverage rules that may shorten a match. The zero value prunes nothing.
type PruneRules struct {
	// SSM cuts the match back to the last SSM snapshot at or before its end, and ends it
	// exactly there; with no snapshot the match is empty.
	SSM bool
	// Attention requires every block that the next token attends to to cover its matched
	// tokens. A block short of them ends the match inside it (partial coverage) or before it
	// (none).
	Attention bool
	// Window is the attention window in tokens for sliding-window attention; 0 means full
	// attention, where every block is attended.
	Window int
	// SinkTokens are the leading tokens a sliding window always attends.
	SinkTokens int
}

func (r PruneRules) any() bool { return r.SSM || r.Attention }

// MatchOptions shape a match.
type MatchOptions struct {
	// Backoff drops this many tokens from the tail of the match.
	Backoff int
	// Alignment trims the match (after backoff) down to a multiple of itself. It must divide
	// tokens per block; 0 is read as 1 (token-granular reuse).
	Alignment int
	// PartialReuse lets the block that diverges contribute the longest common token prefix
	// with one child of the last matched node (needs Query.Tokens).
	PartialReuse bool
	// Prune holds the coverage rules.
	Prune PruneRules
}

// Validate checks the options against tokens per block.
func (o MatchOptions) Validate(tokensPerBlock int) error {
	if o.Backoff < 0 {
		return fmt.Errorf("%w: %d", ErrBackoff, o.Backoff)
	}
	if o.Alignment < 0 || (o.Alignment > 0 && tokensPerBlock%o.Alignment != 0) {
		return fmt.Errorf("%w: alignment %d, tokens per block %d", ErrAlignment, o.Alignment, tokensPerBlock)
	}
	if o.Prune.Window < 0 || o.Prune.SinkTokens < 0 {
		return fmt.Errorf("%w: prune window %d and sink %d must not be negative", ErrConfig, o.Prune.Window, o.Prune.SinkTokens)
	}
	return nil
}

// ValidateAlignment refuses an alignment that is not a positive divisor of tokensPerBlock.
func ValidateAlignment(alignment, tokensPerBlock int) error {
	if alignment < 1 || tokensPerBlock%alignment != 0 {
		return fmt.Errorf("%w: alignment %d, tokens per block %d", ErrAlignment, alignment, tokensPerBlock)
	}
	return nil
}

// Trim applies a backoff and then an alignment to a match length: max(0, raw−backoff)
// rounded down to a multiple of alignment (0 or 1: no rounding).
func Trim(raw, backoff, alignment int) int {
	m := raw - backoff
	if m < 0 {
		return 0
	}
	if alignment > 1 {
		m -= m % alignment
	}
	return m
}

// Match is the result of a match. It is volatile: the nodes may be evicted by any later
// change to the tree unless the caller acquires them.
type Match struct {
	// Blocks are the nodes reused, in order; the last may be used only in part.
	Blocks []NodeID
	// Tokens is the number of reusable tokens.
	Tokens int
	// LookupTokens is the length of the query.
	LookupTokens int
	// RawTokens is the content-divergence depth: how far the query agrees with the tree,
	// before backoff, alignment and pruning.
	RawTokens int
	// AttentionTokens is the match under the attention rule alone (after backoff and
	// alignment, before SSM pruning), for diagnostics.
	AttentionTokens int
	// FirstNewBlock is the index of the first block that is not wholly reused: the first
	// block whose end lies past Tokens.
	FirstNewBlock int
}

// Match finds the reusable prefix of q. It does not change the tree.
func (t *Tree) Match(q Query, o MatchOptions) (Match, error) {
	return t.MatchAppend(nil, q, o)
}

// MatchAppend is Match writing the block list into dst[:0], so a caller can reuse a buffer.
func (t *Tree) MatchAppend(dst []NodeID, q Query, o MatchOptions) (Match, error) {
	if err := o.Validate(t.t); err != nil {
		return Match{}, err
	}
	lookup := len(q.Keys) * t.t
	if q.Tokens != nil {
		if len(q.Keys)*t.t > len(q.Tokens) {
			return Match{}, fmt.Errorf("%w: %d keys cover %d tokens, query has %d", ErrQuery, len(q.Keys), len(q.Keys)*t.t, len(q.Tokens))
		}
		lookup = len(q.Tokens)
	}
	path := dst[:0]
	cur := int32(0)
	raw := 0
	ended := false
	for i := range q.Keys {
		c := t.findChild(cur, &q.Keys[i])
		if c == 0 {
			break
		}
		cn := t.nd(c)
		if cn.flags&flagAbsent != 0 {
			break
		}
		path = append(path, NodeID(c))
		raw += int(cn.nTokens)
		cur = c
		if int(cn.nTokens) < t.t {
			ended = true
			break
		}
	}
	if o.PartialReuse && !ended && q.Tokens != nil {
		start := len(path) * t.t
		if start < len(q.Tokens) {
			end := min(start+t.t, len(q.Tokens))
			if c, l := t.bestPartial(cur, q.Tokens[start:end], q.Scope); l > 0 {
				path = append(path, NodeID(c))
				raw += l
			}
		}
	}
	a := max(o.Alignment, 1)
	m := Trim(raw, o.Backoff, a)
	attn := m
	if o.Prune.any() {
		if o.Prune.Attention {
			attn = t.prune(path, m, a, PruneRules{Attention: true, Window: o.Prune.Window, SinkTokens: o.Prune.SinkTokens})
		}
		m = t.prune(path, m, a, o.Prune)
	}
	nb := (m + t.t - 1) / t.t
	return Match{
		Blocks:          path[:nb],
		Tokens:          m,
		LookupTokens:    lookup,
		RawTokens:       raw,
		AttentionTokens: attn,
		FirstNewBlock:   m / t.t,
	}, nil
}

// bestPartial returns the child of cur with the longest common token prefix with blk, when
// cur has at most PartialScanLimit children. Ties go to the first child scanned.
func (t *Tree) bestPartial(cur int32, blk []int64, scope keys.Hash) (int32, int) {
	n := t.nd(cur)
	if int(n.nChildren) > t.cfg.PartialScanLimit {
		return 0, 0
	}
	best, bestLen := int32(0), 0
	for c := n.firstChild; c != 0; c = t.nd(c).nextSib {
		cn := t.nd(c)
		if cn.flags&(flagTokens|flagAbsent) != flagTokens || t.scopes[c] != scope {
			continue
		}
		st := t.tokens[c]
		l := 0
		for l < len(st) && l < len(blk) && st[l] == blk[l] {
			l++
		}
		if l > bestLen {
			best, bestLen = c, l
		}
	}
	return best, bestLen
}

// prune shortens m until every rule holds. Each rule can only move the endpoint down, and
// every move is re-aligned, so the loop reaches a fixed point.
func (t *Tree) prune(path []NodeID, m, align int, r PruneRules) int {
	for {
		next := m
		if r.Attention {
			next = t.pruneAttention(path, next, r)
		}
		if r.SSM {
			next = t.pruneSSM(path, next)
		}
		if align > 1 {
			next -= next % align
		}
		if next == m {
			return m
		}
		m = next
	}
}

// pruneSSM ends the match at the last snapshot at or before m.
func (t *Tree) pruneSSM(path []NodeID, m int) int {
	nb := min((m+t.t-1)/t.t, len(path))
	for i := nb - 1; i >= 0; i-- {
		cn := t.nd(int32(path[i]))
		if cn.ssmCov == 0 {
			continue
		}
		if p := i*t.t + int(cn.ssmCov); p <= m {
			return p
		}
	}
	return 0
}

// pruneAttention cuts m at the first attended block whose coverage is short of its matched
// tokens. Under a sliding window a block is attended when it overlaps the sink or the last
// Window tokens before m.
func (t *Tree) pruneAttention(path []NodeID, m int, r PruneRules) int {
	nb := min((m+t.t-1)/t.t, len(path))
	for i := 0; i < nb; i++ {
		s := i * t.t
		e := min(s+t.t, m)
		if r.Window > 0 && s >= r.SinkTokens && e <= m-r.Window {
			continue
		}
		cn := t.nd(int32(path[i]))
		if int(cn.attnCov) < e-s {
			return s + int(cn.attnCov)
		}
	}
	return m
}
