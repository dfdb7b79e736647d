package keys

import (
	"encoding/binary"
	"strconv"

	"golang.org/x/crypto/blake2b"
)

// vLLM's old v0 MooncakeStoreConnector (removed with v0): one hash of the whole prompt,
// int(blake2b(int64le(tokens)).hexdigest()[:16], 16) (the first 8 bytes of BLAKE2b-512 as a
// big-endian integer), and the keys "{h}_{tp_rank}" (KV) and "{h}_hidden_{tp_rank}" (hidden
// states). No blocks, no seed, no model name.

func init() {
	RegisterScheme(Scheme{
		Name: "vllm-v0", Engine: EngineVLLM,
		Summary:    "vLLM's old v0 MooncakeStoreConnector: one hash of the whole prompt",
		Seed:       "none",
		Serializer: "int64le tokens", Digest: DigestInfo{Name: "blake2b-512, first 8 bytes", Size: 8},
		KeyLayout: "{decimal hash}_{tp} and {decimal hash}_hidden_{tp}",
		Inputs:    []Input{InputWorldSize, InputRank},
		derive:    deriveVLLMV0,
	})
}

func deriveVLLMV0(s *Scheme, p *Params, tokens []int64, set KeySet) (*Result, error) {
	r := &Result{Scheme: s.Name, Blocks: []Block{}, KeyTokensPerBlock: len(tokens)}
	if len(tokens) == 0 {
		return r, nil
	}
	if set != KeySetNone {
		if err := checkSGLangLayout(sglangOlder, &Params{TPRank: p.TPRank, TPSize: p.TPSize}); err != nil {
			return nil, err
		}
	}
	sum := blake2b.Sum512(encode(nil, tokens))
	h := Digest(sum[:8])
	b := Block{Index: 0, Start: 0, End: len(tokens), Hash: h}
	if set != KeySetNone {
		dec := strconv.FormatUint(binary.BigEndian.Uint64(h), 10)
		ranks := []int{p.TPRank}
		if set == KeySetLookup {
			ranks = ranks[:0]
			for tp := 0; tp < size1(p.TPSize); tp++ {
				ranks = append(ranks, tp)
			}
		}
		for _, tp := range ranks {
			rs := strconv.Itoa(tp)
			b.Keys = append(b.Keys, dec+"_"+rs, dec+"_hidden_"+rs)
		}
	}
	r.Blocks = append(r.Blocks, b)
	return r, nil
}
