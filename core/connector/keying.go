package connector

import (
	"errors"
	"fmt"

	"github.com/kvctl/kvctl/core/keys"
)

// hashChain is one request's block hashes under the rank's key scheme: TensorRT-LLM's chain
// (keys.Chain) or vLLM's (keys.VLLMChain). Extend takes the whole token list so far.
type hashChain interface {
	Extend(tokens []int64) error
	Len() int
	At(i int) keys.PageHash
}

type trtllmChain struct{ c *keys.Chain }

func (t trtllmChain) Extend(tokens []int64) error {
	_, err := t.c.Extend(tokens)
	return err
}
func (t trtllmChain) Len() int               { return t.c.Len() }
func (t trtllmChain) At(i int) keys.PageHash { return keys.PageHashOf(t.c.Hashes()[i]) }

type vllmChain struct{ c *keys.VLLMChain }

func (v vllmChain) Extend(tokens []int64) error {
	_, err := v.c.Extend(tokens)
	return err
}
func (v vllmChain) Len() int               { return v.c.Len() }
func (v vllmChain) At(i int) keys.PageHash { return v.c.At(i) }

// ErrBadKeyInputs is returned (wrapped) by Lookup and AdmissionQuery for a request whose key
// inputs the rank's scheme refuses: inputs of another engine's scheme, or values out of bounds
// (multimodal items out of order, over-long names).
var ErrBadKeyInputs = errors.New("request key inputs")

// errScopeForOtherScheme is returned (wrapped) for a request whose key inputs belong to another
// engine's scheme than the rank's.
var errScopeForOtherScheme = errors.New("key input of another scheme")

// bypassed reports whether req gets no keys: a multimodal request without the identifiers of
// its items (TensorRT-LLM's multimodal digests, or vLLM's multimodal features).
func (o Options) bypassed(req Request) bool {
	if o.VLLM != nil {
		return req.HasMultimodal && len(req.MMFeatures) == 0
	}
	return keys.Bypassed(req.HasMultimodal, req.Scope)
}

// newChain starts req's chain under the rank's key scheme, refusing the key inputs the scheme
// does not take.
func (o Options) newChain(req Request) (hashChain, error) {
	c, err := o.chainFor(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadKeyInputs, err)
	}
	return c, nil
}

func (o Options) chainFor(req Request) (hashChain, error) {
	if v := o.VLLM; v != nil {
		if req.Scope.LoRATaskID != nil || len(req.Scope.Multimodal) > 0 {
			return nil, fmt.Errorf("%w: format %s takes a LoRA name and multimodal features, not TensorRT-LLM's LoRA task id or multimodal digests", errScopeForOtherScheme, v.Scheme())
		}
		c, err := v.NewChain(keys.VLLMScope{CacheSalt: req.Scope.CacheSalt, LoRAName: req.LoRAName, LoRAPath: req.LoRAPath, MMFeatures: req.MMFeatures})
		if err != nil {
			return nil, err
		}
		return vllmChain{c}, nil
	}
	if req.LoRAName != nil || req.LoRAPath != nil || len(req.MMFeatures) > 0 {
		return nil, fmt.Errorf("%w: format %s takes a LoRA task id and multimodal digests, not vLLM's LoRA name or multimodal features", errScopeForOtherScheme, o.Format)
	}
	c, err := keys.NewChain(keys.ChainConfig{Format: o.Format, TokensPerBlock: o.TokensPerBlock, PromptLookahead: o.PromptLookahead, Scope: req.Scope})
	if err != nil {
		return nil, err
	}
	return trtllmChain{c}, nil
}

// writesSharded reports whether this rank writes its sharded pages: always under
// TensorRT-LLM's schemes (each attention rank holds its own shard); under vLLM's, only the
// first TP rank of those vLLM maps to one key rank.
func (o Options) writesSharded() bool { return o.VLLM == nil || o.VLLM.WritesPages() }
