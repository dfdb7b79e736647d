package keys

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// engineKeysPath is the committed copy of vLLM's and SGLang's vectors; sharedEngineKeysPath is
// the full set beside the checkout (CI has it, with more cases than the copy). The tests read
// the full set when it is there and the copy otherwise, and run every case of whichever they
// read.
const (
	engineKeysPath       = "../../testdata/engine-keys.json"
	sharedEngineKeysPath = "../../../shared/testdata/engine-keys.json"
)

// engineKeysSource returns the vectors file the tests read.
func engineKeysSource() string {
	if _, err := os.Stat(sharedEngineKeysPath); err == nil {
		return sharedEngineKeysPath
	}
	return engineKeysPath
}

type engineFile struct {
	VLLM struct {
		Cases []vllmCase `json:"cases"`
		V0    []struct {
			Name      string        `json:"name"`
			Tokens    []json.Number `json:"tokens"`
			TPRank    int           `json:"local_tp_rank"`
			HashInt   json.Number   `json:"tensor_hash_int"`
			KVKey     string        `json:"kv_key"`
			HiddenKey string        `json:"hidden_key"`
		} `json:"v0_legacy_mooncake_store_connector"`
	} `json:"vllm"`
	SGLang struct {
		Cases []sglangCase `json:"cases"`
	} `json:"sglang"`
}

type vllmCase struct {
	Name          string        `json:"name"`
	HashFn        string        `json:"hash_fn"`
	Seed          *string       `json:"PYTHONHASHSEED"`
	HashBlockSize int           `json:"hash_block_size"`
	BlockSize     int           `json:"block_size"`
	Tokens        []json.Number `json:"tokens"`
	LoRAName      *string       `json:"lora_name"`
	CacheSalt     *string       `json:"cache_salt"`
	MMFeatures    []MMFeature   `json:"-"`
	RawMM         []struct {
		Identifier string `json:"identifier"`
		Offset     int    `json:"offset"`
		Length     int    `json:"length"`
	} `json:"mm_features"`
	PromptEmbeds     []json.RawMessage `json:"prompt_embeds_block_digests"`
	NoneHashHex      string            `json:"none_hash_hex"`
	NoneHashPreimage string            `json:"none_hash_preimage_hex"`
	ObjectIdentity   string            `json:"object_identity"`
	BlockHashes      []struct {
		Index       int    `json:"index"`
		TokenSpan   [2]int `json:"token_span"`
		PreimageHex string `json:"preimage_hex"`
		HashHex     string `json:"hash_hex"`
		SpecMatches bool   `json:"spec_encoder_matches"`
	} `json:"block_hashes"`
	Keys []struct {
		Config map[string]any `json:"config"`
		Chunks []struct {
			TokenSpan [2]int `json:"token_span"`
			HashHex   string `json:"hash_hex"`
			Key       string `json:"key"`
		} `json:"chunks"`
	} `json:"keys"`
}

type sglangCase struct {
	Name             string        `json:"name"`
	PageSize         int           `json:"page_size"`
	Tokens           []json.Number `json:"tokens"`
	ExtraKey         *string       `json:"extra_key"`
	CacheSalt        *string       `json:"cache_salt"`
	Bigram           bool          `json:"is_bigram"`
	Continuation     *string       `json:"continuation_prior_hash"`
	NamespaceLineage string        `json:"namespace_lineage"`
	NamespaceSeed    *string       `json:"namespace_seed_hex"`
	Error            string        `json:"error"`
	PageHashes       []struct {
		TokenSpan   [2]int `json:"token_span"`
		PreimageHex string `json:"preimage_hex"`
		HashHex     string `json:"hash_hex"`
	} `json:"page_hashes"`
	Keys []struct {
		Config     map[string]any `json:"config"`
		ObjectKeys []string       `json:"object_keys"`
	} `json:"keys"`
}

func loadEngineKeys(t testing.TB) *engineFile {
	t.Helper()
	path := engineKeysSource()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("engine vectors from %s", path)
	var f engineFile
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.VLLM.Cases) == 0 || len(f.SGLang.Cases) == 0 {
		t.Fatal("engine-keys.json holds no cases")
	}
	return &f
}

func parseTokensJSON(t testing.TB, nums []json.Number) []int64 {
	t.Helper()
	out := make([]int64, len(nums))
	for i, n := range nums {
		v, err := n.Int64()
		if err != nil {
			t.Fatalf("token %s: %v", n, err)
		}
		out[i] = v
	}
	return out
}

// bytesField reads a vector's bytes: a hex string or {"bytes_hex": …}.
func bytesField(t testing.TB, raw json.RawMessage) []byte {
	t.Helper()
	var s string
	if json.Unmarshal(raw, &s) != nil {
		var o struct {
			Hex string `json:"bytes_hex"`
		}
		if err := json.Unmarshal(raw, &o); err != nil {
			t.Fatalf("bytes %s: %v", raw, err)
		}
		s = o.Hex
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bytes %s: %v", raw, err)
	}
	return b
}

// vllmSchemeName maps a vector's hash function and key lineage to the scheme's name.
func vllmSchemeName(t testing.TB, hashFn, lineage string) string {
	t.Helper()
	for _, hf := range vllmHashFns {
		if hf.algo == hashFn {
			switch lineage {
			case "", "B", "C":
				return "vllm" + hf.suffix
			case "A":
				return "vllm-lineage-a" + hf.suffix
			}
		}
	}
	t.Fatalf("no scheme for hash function %q, lineage %q", hashFn, lineage)
	return ""
}

func (c *vllmCase) params(t testing.TB) *Params {
	p := &Params{TokensPerBlock: c.BlockSize, HashBlockSize: c.HashBlockSize, PythonHashSeed: c.Seed,
		LoRAName: c.LoRAName, Scope: Scope{CacheSalt: c.CacheSalt}}
	for _, m := range c.RawMM {
		p.MMFeatures = append(p.MMFeatures, MMFeature{Identifier: m.Identifier, Offset: m.Offset, Length: m.Length})
	}
	if c.PromptEmbeds != nil {
		p.PromptEmbeds = [][]byte{}
		for _, r := range c.PromptEmbeds {
			p.PromptEmbeds = append(p.PromptEmbeds, bytesField(t, r))
		}
	}
	return p
}

// applyConfig sets the key layout of a vector's config on p and returns the lineage. A field
// the test does not know fails it, so that new vectors cannot pass by being ignored.
func applyConfig(t testing.TB, cfg map[string]any, p *Params) (lineage string, derived map[string]any) {
	t.Helper()
	derived = map[string]any{}
	num := func(v any) int {
		f, ok := v.(float64)
		if !ok {
			t.Fatalf("config value %v: not a number", v)
		}
		return int(f)
	}
	for k, v := range cfg {
		switch k {
		case "lineage":
			lineage = v.(string)
		case "model", "served_model_name":
			p.Model = v.(string)
		case "tp_rank":
			p.TPRank = num(v)
		case "tp_size":
			p.TPSize = num(v)
		case "num_kv_heads":
			p.NumKVHeads = num(v)
		case "is_mla":
			p.MLA = v.(bool)
		case "pp_rank":
			p.PPRank = num(v)
		case "pp_size":
			p.PPSize = num(v)
		case "pcp_rank":
			p.PCPRank = num(v)
		case "pcp_size":
			p.PCPSize = num(v)
		case "dcp_rank":
			p.DCPRank = num(v)
		case "dcp_size":
			p.DCPSize = num(v)
		case "group_id":
			p.KVGroup = num(v)
		case "cache_prefix":
			p.CachePrefix = v.(string)
		case "store_namespace":
			p.StoreNamespace = v.(string)
		case "extra_backend_tag":
			p.BackendTag = v.(string)
		case "tp_lcm_size":
			p.TPLCMSize = num(v)
		case "derived_model_name", "derived_key_tp_rank", "derived_config_prefix":
			derived[k] = v
		default:
			t.Errorf("config field %q = %v: not understood by the test", k, v)
		}
	}
	// The vectors give a rank without its size where the size does not enter the key.
	if p.PPSize == 0 && p.PPRank > 0 {
		p.PPSize = p.PPRank + 1
	}
	if p.TPSize == 0 {
		p.TPSize = p.TPRank + 1
	}
	return lineage, derived
}

// TestEngineKeysVLLM checks every vLLM vector of engine-keys.json through the scheme registry:
// the seed and its preimage, every block's preimage and hash, and every key.
func TestEngineKeysVLLM(t *testing.T) {
	f := loadEngineKeys(t)
	for _, c := range f.VLLM.Cases {
		t.Run(c.Name, func(t *testing.T) {
			tokens := parseTokensJSON(t, c.Tokens)
			p := c.params(t)
			var hf vllmHashFn
			for _, h := range vllmHashFns {
				if h.algo == c.HashFn {
					hf = h
				}
			}
			if hf.ser == nil {
				t.Fatalf("hash function %q unknown", c.HashFn)
			}
			var chain *vllmChain
			var err error
			if c.ObjectIdentity != "" {
				chain, err = hashVLLMSharedSaltLoRA(hf, p, tokens)
			} else {
				chain, err = hashVLLM(hf, p, tokens, true)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := hex.EncodeToString(chain.noneHash); got != c.NoneHashHex {
				t.Errorf("NONE_HASH %s, want %s", got, c.NoneHashHex)
			}
			if got := hex.EncodeToString(chain.noneHashPreimage); got != c.NoneHashPreimage {
				t.Errorf("NONE_HASH preimage %s, want %s", got, c.NoneHashPreimage)
			}
			if len(chain.hashes) != len(c.BlockHashes) {
				t.Fatalf("%d block hashes, want %d", len(chain.hashes), len(c.BlockHashes))
			}
			for i, b := range c.BlockHashes {
				if got := hex.EncodeToString(chain.preimages[i]); got != b.PreimageHex {
					t.Errorf("block %d preimage\n got %s\nwant %s", i, got, b.PreimageHex)
				}
				if got := hex.EncodeToString(chain.hashes[i]); got != b.HashHex {
					t.Errorf("block %d hash %s, want %s", i, got, b.HashHex)
				}
				if b.TokenSpan != [2]int{i * chain.hashBlock, (i + 1) * chain.hashBlock} {
					t.Errorf("block %d span %v", i, b.TokenSpan)
				}
			}
			if c.ObjectIdentity != "" {
				return // the registry writes distinct objects; the hash level is checked above
			}
			// The same through the registry, with no keys and then with each config's keys.
			s, err := LookupScheme(vllmSchemeName(t, c.HashFn, "B"))
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Derive(p, tokens, KeySetNone)
			if err != nil {
				t.Fatal(err)
			}
			if r.Seed.String() != c.NoneHashHex || len(r.Blocks) != len(c.BlockHashes) {
				t.Fatalf("registry: seed %s, %d blocks", r.Seed, len(r.Blocks))
			}
			for i, b := range r.Blocks {
				if b.Hash.String() != c.BlockHashes[i].HashHex {
					t.Errorf("registry block %d hash %s, want %s", i, b.Hash, c.BlockHashes[i].HashHex)
				}
			}
			for _, k := range c.Keys {
				kp := *p
				lineage, derived := applyConfig(t, k.Config, &kp)
				s, err := LookupScheme(vllmSchemeName(t, c.HashFn, lineage))
				if err != nil {
					t.Fatal(err)
				}
				if want, ok := derived["derived_model_name"]; ok && vllmModelName(kp.Model) != want {
					t.Errorf("model name %q, want %v", vllmModelName(kp.Model), want)
				}
				if want, ok := derived["derived_key_tp_rank"]; ok && float64(vllmKeyRank(lineage, &kp, kp.TPRank)) != want {
					t.Errorf("%s: key rank %d, want %v", s.Name, vllmKeyRank(lineage, &kp, kp.TPRank), want)
				}
				r, err := s.Derive(&kp, tokens, KeySetSave)
				if err != nil {
					t.Fatalf("%s %v: %v", s.Name, k.Config, err)
				}
				keyed := r.KeyedBlocks()
				if len(keyed) != len(k.Chunks) {
					t.Fatalf("%s %v: %d keyed chunks, want %d", s.Name, k.Config, len(keyed), len(k.Chunks))
				}
				for i, ch := range k.Chunks {
					b := keyed[i]
					start, end := b.Start, b.End
					if b.ChunkEnd != 0 {
						start, end = b.ChunkStart, b.ChunkEnd
					}
					if [2]int{start, end} != ch.TokenSpan || b.Hash.String() != ch.HashHex || len(b.Keys) != 1 || b.Keys[0] != ch.Key {
						t.Errorf("%s chunk %d: span %d-%d hash %s keys %v\nwant span %v hash %s key %s", s.Name, i, start, end, b.Hash, b.Keys, ch.TokenSpan, ch.HashHex, ch.Key)
					}
				}
			}
		})
	}
}

// hashVLLMSharedSaltLoRA hashes as hashVLLM with the LoRA name and the cache salt one str
// object, as the vector with object_identity has them.
func hashVLLMSharedSaltLoRA(hf vllmHashFn, p *Params, tokens []int64) (*vllmChain, error) {
	if p.LoRAName == nil || p.Scope.CacheSalt == nil {
		return nil, errors.New("object identity needs a LoRA name and a cache salt")
	}
	c, err := hashVLLM(hf, p, tokens, true)
	if err != nil || len(c.hashes) == 0 {
		return c, err
	}
	extra := c.extras[0]
	for i := range extra {
		if extra[i].kind == pyStr && extra[i].s == *p.LoRAName {
			extra[i].id = 1
		}
	}
	pre, err := hf.ser.appendBlock(nil, c.noneHash, tokens[:c.hashBlock], extra)
	if err != nil {
		return nil, err
	}
	c.preimages[0], c.hashes[0] = pre, hf.sum(nil, pre)
	for i := 1; i < len(c.hashes); i++ {
		pre, err := hf.ser.appendBlock(nil, c.hashes[i-1], tokens[i*c.hashBlock:(i+1)*c.hashBlock], c.extras[i])
		if err != nil {
			return nil, err
		}
		c.preimages[i], c.hashes[i] = pre, hf.sum(nil, pre)
	}
	return c, nil
}

// TestEngineKeysVLLMV0 checks the old v0 connector's vectors through the registry.
func TestEngineKeysVLLMV0(t *testing.T) {
	f := loadEngineKeys(t)
	s, err := LookupScheme("vllm-v0")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range f.VLLM.V0 {
		r, err := s.Derive(&Params{TPRank: c.TPRank, TPSize: c.TPRank + 1}, parseTokensJSON(t, c.Tokens), KeySetSave)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Blocks) != 1 || strings.Join(r.Blocks[0].Keys, " ") != c.KVKey+" "+c.HiddenKey {
			t.Errorf("%s: %+v, want keys %s %s", c.Name, r.Blocks, c.KVKey, c.HiddenKey)
		}
	}
}

// TestEngineKeysSGLang checks every SGLang vector: namespace seeds, page preimages and hashes,
// object keys, and the ids SGLang cannot hash.
func TestEngineKeysSGLang(t *testing.T) {
	f := loadEngineKeys(t)
	for _, c := range f.SGLang.Cases {
		t.Run(c.Name, func(t *testing.T) {
			tokens := parseTokensJSON(t, c.Tokens)
			p := &Params{TokensPerBlock: c.PageSize, ExtraKey: c.ExtraKey, Scope: Scope{CacheSalt: c.CacheSalt}, Bigram: c.Bigram}
			if c.Continuation != nil {
				p.PriorHash, _ = hex.DecodeString(*c.Continuation)
			}
			var namespaced bool
			var hashScheme string
			switch c.NamespaceLineage {
			case "post-38577":
				namespaced, hashScheme = true, "sglang"
			case "pre-38577":
				hashScheme = "sglang-pre-38577"
				p.ExtraKey, p.Scope.CacheSalt = nil, nil // that lineage ignores them
			default:
				t.Fatalf("namespace lineage %q", c.NamespaceLineage)
			}
			seed, hashes, preimages, err := hashSGLang(p, tokens, namespaced, true)
			if c.Error != "" {
				if !errors.Is(err, ErrTokenOutOfRange) {
					t.Fatalf("error %v, want ErrTokenOutOfRange (%s)", err, c.Error)
				}
				s, _ := LookupScheme(hashScheme)
				if _, err := s.Derive(p, tokens, KeySetNone); !errors.Is(err, ErrTokenOutOfRange) {
					t.Errorf("registry: error %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantSeed := ""
			if c.NamespaceSeed != nil {
				wantSeed = *c.NamespaceSeed
			}
			if hex.EncodeToString(seed) != wantSeed {
				t.Errorf("namespace seed %x, want %s", seed, wantSeed)
			}
			if len(hashes) != len(c.PageHashes) {
				t.Fatalf("%d pages, want %d", len(hashes), len(c.PageHashes))
			}
			for i, ph := range c.PageHashes {
				if hex.EncodeToString(preimages[i]) != ph.PreimageHex || hex.EncodeToString(hashes[i]) != ph.HashHex {
					t.Errorf("page %d: preimage %x hash %x\nwant %s %s", i, preimages[i], hashes[i], ph.PreimageHex, ph.HashHex)
				}
				if ph.TokenSpan != [2]int{i * c.PageSize, (i + 1) * c.PageSize} {
					t.Errorf("page %d span %v", i, ph.TokenSpan)
				}
			}
			for _, k := range c.Keys {
				kp := *p
				lineage, derived := applyConfig(t, k.Config, &kp)
				name := hashScheme
				if lineage == "older" {
					if namespaced && (kp.ExtraKey != nil || kp.Scope.CacheSalt != nil) {
						t.Fatalf("older key lineage with a namespace seed: no scheme")
					}
					name = "sglang-legacy"
					kp.Model = ""
				}
				s, err := LookupScheme(name)
				if err != nil {
					t.Fatal(err)
				}
				if want, ok := derived["derived_config_prefix"]; ok && sglangPrefix(lineage, &kp) != want.(string)+"_" {
					t.Errorf("prefix %q, want %v_", sglangPrefix(lineage, &kp), want)
				}
				r, err := s.Derive(&kp, tokens, KeySetSave)
				if err != nil {
					t.Fatalf("%s %v: %v", name, k.Config, err)
				}
				var got []string
				for _, b := range r.Blocks {
					got = append(got, b.Keys...)
				}
				if strings.Join(got, "\n") != strings.Join(k.ObjectKeys, "\n") {
					t.Errorf("%s %v keys\n got %q\nwant %q", name, k.Config, got, k.ObjectKeys)
				}
			}
		})
	}
}

// TestEngineKeysCopyIsSubsetOfShared checks that every case of the committed copy is in the
// shared file, byte for byte as JSON, when the shared file is beside the checkout: the shared
// file may hold more cases, never other ones.
func TestEngineKeysCopyIsSubsetOfShared(t *testing.T) {
	shared, err := os.ReadFile(sharedEngineKeysPath)
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("no shared engine-keys.json beside the checkout")
	}
	if err != nil {
		t.Fatal(err)
	}
	copyData, err := os.ReadFile(engineKeysPath)
	if err != nil {
		t.Fatal(err)
	}
	type sections struct {
		VLLM struct {
			Cases []json.RawMessage `json:"cases"`
			V0    []json.RawMessage `json:"v0_legacy_mooncake_store_connector"`
		} `json:"vllm"`
		SGLang struct {
			Cases []json.RawMessage `json:"cases"`
		} `json:"sglang"`
	}
	index := func(data []byte) map[string]map[string]string {
		var s sections
		if err := json.Unmarshal(data, &s); err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]string{}
		add := func(sec string, cases []json.RawMessage) {
			out[sec] = map[string]string{}
			for _, c := range cases {
				var named struct {
					Name string `json:"name"`
				}
				if err := json.Unmarshal(c, &named); err != nil {
					t.Fatal(err)
				}
				var v any
				if err := json.Unmarshal(c, &v); err != nil {
					t.Fatal(err)
				}
				canon, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				out[sec][named.Name] = string(canon)
			}
		}
		add("vllm", s.VLLM.Cases)
		add("vllm_v0", s.VLLM.V0)
		add("sglang", s.SGLang.Cases)
		return out
	}
	mine, full := index(copyData), index(shared)
	n := 0
	for sec, cases := range mine {
		for name, c := range cases {
			n++
			got, ok := full[sec][name]
			switch {
			case !ok:
				t.Errorf("%s case %q of the committed copy is not in the shared file", sec, name)
			case got != c:
				t.Errorf("%s case %q differs between the committed copy and the shared file", sec, name)
			}
		}
	}
	if n == 0 {
		t.Fatal("the committed copy holds no cases")
	}
}
