package keys

import (
	"errors"
	"fmt"
)

// ErrNoLayerGroups is returned (wrapped) by Recipe.ValidateKeys when a recipe that must name
// keys has no layer group: every key names a layer group's page size.
var ErrNoLayerGroups = errors.New("keys need at least one layer group")

// KeySet selects which keys Recipe.Derive names for each block.
type KeySet string

// Key sets.
const (
	// KeySetNone names no keys: Derive gives the hashes only.
	KeySetNone KeySet = ""
	// KeySetSave names the keys this rank writes for a block (Namespace.SaveKeys).
	KeySetSave KeySet = "save"
	// KeySetLookup names every key that must exist for a block to be a hit
	// (Namespace.BlockKeys).
	KeySetLookup KeySet = "lookup"
)

// Recipe is the one derivation from a prompt's key inputs to its block hashes and pool keys:
// the hash format and block geometry that make the chain, the namespace and attention shard of
// the writing rank, and the page geometry of every layer group. kvctl hash, kvctl probe-pool,
// the connector's lookups and the daemon's engine registrations all derive keys through it, so
// that the keys an engine writes are the ones kvctl looks for. A request's scope (cache
// salt, LoRA task id, multimodal digests) is per request and given to each call.
//
// A Recipe is a value: its methods do not modify it, and they are safe for concurrent use as
// long as nobody writes Groups meanwhile.
type Recipe struct {
	// Format selects the hash derivation; "" means FormatTRTLLM.
	Format Format
	// TokensPerBlock (T) and PromptLookahead (L) are the chain's geometry (see ChainConfig).
	TokensPerBlock  int
	PromptLookahead int
	// Namespace names the writing rank's namespace, model and attention shard.
	Namespace Namespace
	// Groups is the page geometry of every layer group, in key order. Hashes need none; keys
	// need at least one.
	Groups []LayerGroupPages
}

// ChainConfig returns the chain configuration of a request with reuse scope s.
func (r Recipe) ChainConfig(s Scope) ChainConfig {
	return ChainConfig{Format: r.Format, TokensPerBlock: r.TokensPerBlock, PromptLookahead: r.PromptLookahead, Scope: s}
}

// NewChain validates the chain configuration of a request with reuse scope s and returns an
// empty chain for it.
func (r Recipe) NewChain(s Scope) (*Chain, error) {
	return NewChain(r.ChainConfig(s))
}

// ValidateKeys reports what keeps the recipe from naming keys: every problem of the namespace,
// then ErrNoLayerGroups when it has no layer group. It does not check the chain's geometry
// (NewChain does).
func (r Recipe) ValidateKeys() error {
	if err := r.Namespace.Validate(); err != nil {
		return err
	}
	if len(r.Groups) == 0 {
		return ErrNoLayerGroups
	}
	return nil
}

// LookupKeysPerBlock is the number of keys AppendLookupKeys names for one block.
func (r Recipe) LookupKeysPerBlock() int {
	n, world := 0, r.Namespace.AttentionWorldSize()
	for _, g := range r.Groups {
		n += max(world, 0)
		if g.ReplicatedBytesPerPage > 0 {
			n++
		}
	}
	return n
}

// AppendLookupKeys appends every key a lookup needs for each block of hashes, block by block
// in the order of Namespace.BlockKeys, to dst and returns the extended slice.
func (r Recipe) AppendLookupKeys(dst []string, hashes ...Hash) []string {
	for _, h := range hashes {
		dst = r.Namespace.AppendBlockKeys(dst, r.TokensPerBlock, r.Groups, h)
	}
	return dst
}

// AppendSaveKeys appends the keys this rank writes for each block of hashes, block by block in
// the order of Namespace.SaveKeys, to dst and returns the extended slice.
func (r Recipe) AppendSaveKeys(dst []string, hashes ...Hash) []string {
	for _, h := range hashes {
		dst = r.Namespace.AppendSaveKeys(dst, r.TokensPerBlock, r.Groups, h)
	}
	return dst
}

// Prompt is one request's input to the recipe.
type Prompt struct {
	// Tokens are the prompt's token ids.
	Tokens []int64
	// Scope is the request's reuse scope.
	Scope Scope
	// HasMultimodal is set when the prompt has multimodal positions; without multimodal
	// digests in Scope it then gets no keys (see Bypassed).
	HasMultimodal bool
}

// BlockKeys is one full block of a derived prompt.
type BlockKeys struct {
	// Index is the block's number, from 0; [Start, End) is its span (see Chain.BlockSpan).
	Index, Start, End int
	// Hash is the block's hash.
	Hash Hash
	// GroupKey and Keys are set when keys were asked for: the block's eviction group and the
	// keys of the key set, in the order of Namespace.SaveKeys or Namespace.BlockKeys.
	GroupKey string
	Keys     []string
}

// Derivation is what the recipe gives for one prompt.
type Derivation struct {
	// Seed is the scope seed, the parent of block 0.
	Seed Hash
	// Bypassed is set when the prompt gets no keys (see Bypassed); it then has no blocks.
	Bypassed bool
	// Blocks are the prompt's full blocks.
	Blocks []BlockKeys
	// UncoveredTokens are the tokens after the last full block's own T tokens (every token
	// when bypassed).
	UncoveredTokens int
}

// Derive hashes the full blocks of p and, unless set is KeySetNone, names each block's group
// key and the keys of set. It validates the chain configuration and, when keys are asked for,
// the recipe's namespace and layer groups (ValidateKeys).
func (r Recipe) Derive(p Prompt, set KeySet) (*Derivation, error) {
	switch set {
	case KeySetNone:
	case KeySetSave, KeySetLookup:
		if err := r.ValidateKeys(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("key set %q: want %q or %q", set, KeySetSave, KeySetLookup)
	}
	chain, err := r.NewChain(p.Scope)
	if err != nil {
		return nil, err
	}
	d := &Derivation{Seed: chain.Seed(), Blocks: []BlockKeys{}}
	if Bypassed(p.HasMultimodal, p.Scope) {
		d.Bypassed, d.UncoveredTokens = true, len(p.Tokens)
		return d, nil
	}
	hashes, err := chain.Extend(p.Tokens)
	if err != nil {
		return nil, err
	}
	d.Blocks = make([]BlockKeys, len(hashes))
	for i, h := range hashes {
		start, end := chain.BlockSpan(i)
		b := BlockKeys{Index: i, Start: start, End: end, Hash: h}
		switch set {
		case KeySetSave:
			b.GroupKey, b.Keys = r.Namespace.GroupKey(h), r.Namespace.SaveKeys(r.TokensPerBlock, r.Groups, h)
		case KeySetLookup:
			b.GroupKey, b.Keys = r.Namespace.GroupKey(h), r.Namespace.BlockKeys(r.TokensPerBlock, r.Groups, h)
		}
		d.Blocks[i] = b
	}
	d.UncoveredTokens = len(p.Tokens) - len(hashes)*r.TokensPerBlock
	return d, nil
}
