package keys

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestVLLMRankMatchesDerive checks the connector's incremental vLLM chain and key prefixes
// against the scheme's whole-prompt derivation (which the engine-keys vectors pin), over
// random prompts, scopes, block geometries and ranks, extended in random pieces.
func TestVLLMRankMatchesDerive(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	seed, salt, lora, loraPath := "0", "salt-1", "adapter", "/adapters/a"
	for iter := range 200 {
		scheme := VLLMRankSchemes[iter%len(VLLMRankSchemes)]
		hb := []int{1, 4, 16}[rng.IntN(3)]
		block := hb * (1 + rng.IntN(3))
		tp := []int{1, 2, 4}[rng.IntN(3)]
		p := Params{TokensPerBlock: block, PythonHashSeed: &seed, Model: "org/Llama-3.1-8B/", TPSize: tp,
			TPRank: rng.IntN(tp), NumKVHeads: []int{1, 2, 8}[rng.IntN(3)], CachePrefix: "pfx", StoreNamespace: "-ns"}
		if hb != block {
			p.HashBlockSize = hb
		}
		tagged := iter%3 == 0
		if tagged {
			p.VLLMExtraKeys = VLLMExtraKeysTagged
		}
		r, err := NewVLLMRank(scheme, p)
		if err != nil {
			t.Fatalf("%s: %v", scheme, err)
		}
		var scope VLLMScope
		if rng.IntN(2) == 0 {
			scope.CacheSalt = &salt
		}
		if rng.IntN(2) == 0 {
			scope.LoRAName = &lora
			if tagged {
				scope.LoRAPath = &loraPath
			}
		}
		n := rng.IntN(6 * block)
		if rng.IntN(2) == 0 && n > 3 {
			scope.MMFeatures = []MMFeature{{Identifier: "img0", Offset: rng.IntN(n / 2), Length: 1 + rng.IntN(n/2)}}
		}
		tokens := make([]int64, n)
		for i := range tokens {
			tokens[i] = rng.Int64N(1 << 20)
		}
		c, err := r.NewChain(scope)
		if err != nil {
			t.Fatal(err)
		}
		for at := 0; at < n; {
			at = min(n, at+1+rng.IntN(2*block))
			if _, err := c.Extend(tokens[:at]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.Extend(tokens); err != nil {
			t.Fatal(err)
		}
		dp := p
		dp.Scope.CacheSalt, dp.LoRAName, dp.LoRAPath, dp.MMFeatures = scope.CacheSalt, scope.LoRAName, scope.LoRAPath, scope.MMFeatures
		s, _ := LookupScheme(scheme)
		for _, set := range []KeySet{KeySetSave, KeySetLookup} {
			res, err := s.Derive(&dp, tokens, set)
			if err != nil {
				t.Fatal(err)
			}
			if c.Len() != n/block {
				t.Fatalf("%s: chain has %d blocks for %d tokens of %d", scheme, c.Len(), n, block)
			}
			for i := range c.Len() {
				want := res.Blocks[(i+1)*block/hb-1]
				got := c.At(i)
				if got.String() != want.Hash.String() {
					t.Fatalf("%s iter %d block %d: hash %s, Derive %s", scheme, iter, i, got, want.Hash)
				}
				var keys []string
				if set == KeySetSave {
					keys = []string{string(got.AppendHex([]byte(r.PageKeyPrefix(p.TPRank, 0))))}
				} else {
					for _, pre := range r.LookupKeyPrefixes(0) {
						keys = append(keys, string(got.AppendHex([]byte(pre))))
					}
				}
				if !slices.Equal(keys, want.Keys) {
					t.Fatalf("%s iter %d block %d %s keys:\n got %q\nwant %q", scheme, iter, i, set, keys, want.Keys)
				}
			}
		}
	}
}

func TestVLLMRankGroupAndWriters(t *testing.T) {
	seed := "0"
	r, err := NewVLLMRank("vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m", TPSize: 4, TPRank: 1, NumKVHeads: 2})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.PageKeyPrefix(1, 3); got != "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:3@" {
		t.Fatalf("prefix %q", got)
	}
	if got := r.LookupKeyPrefixes(0); len(got) != 2 || !strings.Contains(got[1], "@tp_rank:1@") {
		t.Fatalf("lookup prefixes %q: want key ranks 0 and 1", got)
	}
	// TP ranks 0 and 1 share key rank 0: rank 1 does not write.
	if r.WritesPages() {
		t.Fatal("rank 1 of 4 with 2 KV heads writes key rank 0's pages a second time")
	}
}

func TestVLLMRankRefuses(t *testing.T) {
	seed := "0"
	salt := "s"
	for _, tc := range []struct {
		name   string
		scheme string
		p      Params
		want   string
	}{
		{"no seed", "vllm", Params{TokensPerBlock: 16, Model: "m"}, "PYTHONHASHSEED"},
		{"no model", "vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed}, "--model"},
		{"lineage A", "vllm-lineage-a", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m"}, "vllm-lineage-a"},
		{"trtllm", "trtllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m"}, "trtllm"},
		{"hash block", "vllm", Params{TokensPerBlock: 16, HashBlockSize: 5, PythonHashSeed: &seed, Model: "m"}, "divide"},
		{"pp", "vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m", PPSize: 2}, "tensor-parallel"},
		{"scope", "vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m", Scope: Scope{CacheSalt: &salt}}, "request scope"},
		{"tp heads", "vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m", TPSize: 2}, "KV head count"},
		{"extra keys", "vllm", Params{TokensPerBlock: 16, PythonHashSeed: &seed, Model: "m", VLLMExtraKeys: "bare"}, "want untagged"},
	} {
		_, err := NewVLLMRank(tc.scheme, tc.p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	r, err := NewVLLMRank("vllm", Params{TokensPerBlock: 4, PythonHashSeed: &seed, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.NewChain(VLLMScope{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(make([]int64, 8)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Extend(make([]int64, 4)); !errors.Is(err, ErrTokensShrank) {
		t.Fatalf("shrunk tokens: %v", err)
	}
	if _, err := r.NewChain(VLLMScope{MMFeatures: []MMFeature{{Identifier: "a", Offset: 5}, {Identifier: "b", Offset: 1}}}); err == nil {
		t.Fatal("unsorted multimodal items accepted")
	}
	name := "a"
	if _, err := r.NewChain(VLLMScope{LoRAName: &name, LoRAPath: &name}); err == nil || !strings.Contains(err.Error(), "--lora-path") {
		t.Fatalf("a LoRA path with untagged extra keys: %v", err)
	}
	tr, err := NewVLLMRank("vllm", Params{TokensPerBlock: 4, PythonHashSeed: &seed, Model: "m", VLLMExtraKeys: VLLMExtraKeysTagged})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.NewChain(VLLMScope{LoRAName: &name}); err == nil || !strings.Contains(err.Error(), "--lora-path") {
		t.Fatalf("a LoRA name without its path under tagged extra keys: %v", err)
	}
}

func TestPageHash(t *testing.T) {
	h := Hash{1, 2, 3}
	p := PageHashOf(h)
	if p.Len() != 16 || p.String() != h.String() {
		t.Fatalf("%v", p)
	}
	back, ok := p.Hash()
	if !ok || back != h {
		t.Fatal("round trip")
	}
	if _, err := ParsePageHash(make([]byte, 20)); err == nil {
		t.Fatal("20-byte hash accepted")
	}
	q, err := ParsePageHash(make([]byte, 32))
	if err != nil || q.Len() != 32 || len(q.AppendHex(nil)) != 64 {
		t.Fatalf("%v %v", q, err)
	}
	if _, ok := q.Hash(); ok {
		t.Fatal("32-byte digest as a 16-byte Hash")
	}
	if PageHashOf(h) != p {
		t.Fatal("not comparable by value")
	}
}
