package kvcache

import (
	"encoding/hex"
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// Prompt is a request's prompt as the manager keys it: its tokens and its reuse scope (cache
// salt, LoRA adapter, multimodal digests). Two prompts share local blocks only where their
// chains agree, so a scope keeps requests apart exactly as it keeps their pool keys apart.
type Prompt struct {
	Tokens []int64
	Scope  keys.Scope
}

// chain returns the block hash chain of prompt's full blocks of T tokens: the chain the
// connector derives pool keys from (core/keys, the default format, no prompt lookahead).
func chain(p Prompt, T int) (*keys.Chain, error) {
	c, err := keys.NewChain(keys.ChainConfig{TokensPerBlock: T, Scope: p.Scope})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if _, err := c.Extend(p.Tokens); err != nil {
		return nil, err
	}
	return c, nil
}

// partialKey names a partial tail block (partial reuse) under the block whose chain hash is
// parent (the chain's seed for block 0). The chain has no hash for a partial block, so it is
// the one-block chain of the tail's tokens whose cache salt is the parent hash: it commits to
// the parent, and through it to the whole prefix and the scope.
func partialKey(parent keys.Hash, tokens []int64) (keys.Hash, error) {
	salt := hex.EncodeToString(parent[:])
	c, err := keys.NewChain(keys.ChainConfig{TokensPerBlock: len(tokens), Scope: keys.Scope{CacheSalt: &salt}})
	if err != nil {
		return keys.Hash{}, err
	}
	hs, err := c.Extend(tokens)
	if err != nil {
		return keys.Hash{}, err
	}
	return hs[0], nil
}
