package keys

// TensorRT-LLM's mooncake-store schemes and kvctl's own blake3: the schemes with a 16-byte chain
// (ChainRules) that kvctl serve's connector runs. Their keys are
// "{namespace}/{model}/{shard}/lg{group}/t{T}b{bytes}/{hash}" (see Namespace).

var trtllmInputs = []Input{
	InputTokensPerBlock, InputPromptLookahead, InputCacheSalt, InputLoRAID, InputMMHash, InputHasMultimodal,
	InputNamespace, InputModelKey, InputWorldSize, InputRank, InputAttentionDP, InputLayerGroup, InputReplicated,
}

const trtllmKeyLayout = "{namespace}/{model-key}/w{W}r{R}|replicated/lg{group}/t{T}b{bytes per page}/{hash32}"

func init() {
	blake2 := DigestInfo{Name: "blake2b-128", Size: HashSize}
	RegisterScheme(Scheme{
		Name: string(FormatTRTLLM), Engine: EngineTRTLLM, Default: true,
		Summary:    "TensorRT-LLM's main line, with the prompt-lookahead rule",
		Seed:       `B(framed(salt, lora, mm…)), re-digested with "prompt-lookahead" ‖ u64le(L) when L > 0`,
		Serializer: "int64le tokens", Digest: blake2, KeyLayout: trtllmKeyLayout, Inputs: trtllmInputs, TokensPerBlock: 32,
		Chain:  &ChainRules{Lookahead: true, FullScope: true, SeedPreimage: seedPreimageFramed},
		derive: deriveChain,
	})
	RegisterScheme(Scheme{
		Name: string(FormatTRTLLMLookaheadV2), Engine: EngineTRTLLM,
		Summary:    `TensorRT-LLM's "mooncake-kv-v2" branch: salt-only seed, prompt lookahead`,
		Seed:       `B("mooncake-kv-v2" ‖ "salt" ‖ salt), re-digested when L > 0`,
		Serializer: "int64le tokens", Digest: blake2, KeyLayout: trtllmKeyLayout, Inputs: trtllmInputs, TokensPerBlock: 32,
		Chain:  &ChainRules{Lookahead: true, SeedPreimage: seedPreimageV2},
		derive: deriveChain,
	})
	RegisterScheme(Scheme{
		Name: string(FormatTRTLLMV1), Engine: EngineTRTLLM,
		Summary:    "TensorRT-LLM's oldest branch: salt-only seed, no lookahead",
		Seed:       `B("salt" ‖ salt)`,
		Serializer: "int64le tokens", Digest: blake2, KeyLayout: trtllmKeyLayout, Inputs: trtllmInputs, TokensPerBlock: 32,
		Chain:  &ChainRules{SeedPreimage: seedPreimageV1},
		derive: deriveChain,
	})
	RegisterScheme(Scheme{
		Name: string(FormatBLAKE3), Engine: EngineKvctl,
		Summary:    "kvctl only: the trtllm framing digested with BLAKE3; faster, never matches TensorRT-LLM",
		Seed:       "as trtllm, digested with BLAKE3 (key-derivation mode)",
		Serializer: "int64le tokens", Digest: DigestInfo{Name: "blake3-128", Size: HashSize}, KeyLayout: trtllmKeyLayout, Inputs: trtllmInputs, TokensPerBlock: 32,
		Chain:  &ChainRules{Lookahead: true, FullScope: true, BLAKE3: true, SeedPreimage: seedPreimageFramed},
		derive: deriveChain,
	})
}

// Recipe returns the key recipe of a 16-byte-chain scheme for p.
func (s *Scheme) Recipe(p *Params) Recipe {
	return Recipe{Format: Format(s.Name), TokensPerBlock: p.TokensPerBlock, PromptLookahead: p.PromptLookahead,
		Namespace: p.Namespace, Groups: p.Groups}
}

// deriveChain derives through Recipe, so that hash, probe-pool and the connector agree byte for
// byte.
func deriveChain(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
	rec := s.Recipe(p)
	d, err := rec.Derive(Prompt{Tokens: tokens, Scope: p.Scope, HasMultimodal: p.HasMultimodal}, set)
	if err != nil {
		return nil, err
	}
	seed := d.Seed
	r := &Result{Scheme: s.Name, Seed: Digest(seed[:]), Bypassed: d.Bypassed, Blocks: make([]Block, len(d.Blocks)),
		UncoveredTokens: d.UncoveredTokens, KeyTokensPerBlock: p.TokensPerBlock}
	for i, b := range d.Blocks {
		h := b.Hash
		r.Blocks[i] = Block{Index: b.Index, Start: b.Start, End: b.End, Hash: Digest(h[:]), GroupKey: b.GroupKey, Keys: b.Keys}
	}
	return r, nil
}
