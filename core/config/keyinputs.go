package config

import (
	"fmt"
	"strings"
)

// KeyInputs are the settings the pool key derivation reads (`kvctl hash --from-config`).
type KeyInputs struct {
	Namespace      string `json:"namespace"`
	ModelKey       string `json:"model_key"`
	TokensPerBlock int64  `json:"tokens_per_block"`
	// WorldSize is the tensor parallel size; with AttentionDP every owner keys pages as w1r0.
	WorldSize   int64 `json:"world_size"`
	AttentionDP bool  `json:"attention_dp"`
	// PromptLookahead is the one-model draft's lookahead that re-seeds the chain (seed commit 14).
	PromptLookahead int64 `json:"prompt_lookahead"`
}

// KeyInputs reads the key inputs from this file alone; see KeyInputsFrom.
func (f *File) KeyInputs() (KeyInputs, error) { return KeyInputsFrom(f) }

// KeyInputsFrom gathers the key inputs from several loaded files. A TensorRT-LLM YAML gives
// tokens per block, world size, attention DP and the lookahead, and the namespace and model
// key of its block; a client config (the YAML's inherited one first) gives the namespace and
// model key when the block leaves them out, then a pool manifest gives the namespace, and
// finally the namespace defaults to trtllm. A YAML without kv_cache_config.tokens_per_block
// uses TensorRT-LLM's default of 32. It returns an error wrapping ErrMissingKeyInput naming
// every input no file gave.
func KeyInputsFrom(files ...*File) (KeyInputs, error) {
	var k KeyInputs
	var ns, model *string
	haveLayout := false
	take := func(dst **string, v *string) {
		if *dst == nil && v != nil && *v != "" {
			*dst = v
		}
	}
	for _, f := range files {
		if f == nil || f.TRTLLM == nil {
			continue
		}
		t := f.TRTLLM
		if !haveLayout {
			haveLayout = true
			k.TokensPerBlock = t.KVCache.TokensPerBlock
			k.WorldSize = t.TensorParallelSize
			k.AttentionDP = t.EnableAttentionDP
			k.PromptLookahead = t.Speculative.PromptLookahead()
		}
		if b := f.Store(); b != nil {
			take(&ns, b.Namespace)
			take(&model, b.ModelKey)
		}
		if f.Inherited != nil {
			take(&ns, &f.Inherited.Namespace)
			take(&model, f.Inherited.ModelKey)
		}
	}
	for _, f := range files {
		if f != nil && f.Client != nil {
			take(&ns, &f.Client.Namespace)
			take(&model, f.Client.ModelKey)
		}
	}
	for _, f := range files {
		if f != nil && f.Manifest != nil {
			take(&ns, &f.Manifest.Namespace)
		}
	}
	if ns != nil {
		k.Namespace = *ns
	} else {
		k.Namespace = DefaultNamespace
	}
	var missing []string
	if model != nil {
		k.ModelKey = *model
	} else {
		missing = append(missing, "model_key")
	}
	if !haveLayout {
		missing = append(missing, "tokens_per_block, world size and attention DP (from a TensorRT-LLM YAML)")
	}
	if len(missing) > 0 {
		return k, fmt.Errorf("%w: %s", ErrMissingKeyInput, strings.Join(missing, "; "))
	}
	return k, nil
}
