package keys

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

func TestRegistry(t *testing.T) {
	names := SchemeNames()
	if names[0] != "trtllm" || DefaultScheme().Name != "trtllm" {
		t.Errorf("default scheme %s, first %s", DefaultScheme().Name, names[0])
	}
	// The 16-byte-chain formats are exactly the four TensorRT-LLM and kvctl ones, in their old order.
	if got := Formats(); !slices.Equal(got, []Format{FormatTRTLLM, FormatTRTLLMLookaheadV2, FormatTRTLLMV1, FormatBLAKE3}) {
		t.Errorf("Formats() = %v", got)
	}
	for _, want := range []string{"vllm", "vllm-sha256-cbor", "vllm-xxhash", "vllm-xxhash-cbor", "vllm-lineage-a", "sglang", "sglang-legacy", "vllm-v0"} {
		if _, err := LookupScheme(want); err != nil {
			t.Error(err)
		}
	}
	if _, err := LookupScheme(""); !errors.Is(err, ErrUnknownFormat) {
		t.Errorf("empty name: %v", err)
	}
	if _, err := ParseFormat("vllm"); !errors.Is(err, ErrUnknownFormat) || !strings.Contains(err.Error(), "vLLM scheme") {
		t.Errorf("ParseFormat(vllm) = %v: a vLLM scheme has no 16-byte chain", err)
	}
	seen := map[string]bool{}
	for _, s := range Schemes() {
		if seen[s.Name] {
			t.Errorf("%s registered twice", s.Name)
		}
		seen[s.Name] = true
		if s.Summary == "" || s.KeyLayout == "" || s.Seed == "" || s.Serializer == "" || len(s.Inputs) == 0 {
			t.Errorf("%s: incomplete description %+v", s.Name, s)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("registering a duplicate name did not panic")
			}
		}()
		RegisterScheme(*DefaultScheme())
	}()
}

func TestCheckInputs(t *testing.T) {
	s, _ := LookupScheme("sglang")
	if err := s.CheckInputs([]Input{InputExtraKey, InputModel}); err != nil {
		t.Error(err)
	}
	err := s.CheckInputs([]Input{InputLoRAID, InputPythonHashSeed, InputModel})
	if err == nil || !strings.Contains(err.Error(), "--lora-id, --python-hash-seed") || strings.Contains(err.Error(), "does not take --model") {
		t.Errorf("error %v", err)
	}
}

func TestVLLMNeedsPythonHashSeed(t *testing.T) {
	for _, s := range Schemes() {
		if s.Engine != EngineVLLM || s.Name == "vllm-v0" {
			continue
		}
		_, err := s.Derive(&Params{TokensPerBlock: 4}, []int64{1, 2, 3, 4}, KeySetNone)
		if !errors.Is(err, ErrNoPythonHashSeed) || !strings.Contains(err.Error(), "random per process") {
			t.Errorf("%s without a seed: %v", s.Name, err)
		}
	}
}

// goldenPrompt is the prompt every scheme's own golden file derives.
func goldenPrompt() []int64 {
	toks := make([]int64, 70)
	for i := range toks {
		toks[i] = int64(i*7919%151646 + 1)
	}
	return toks
}

// goldenParams sets every input a scheme takes to a fixed value.
func goldenParams(s *Scheme) *Params {
	seed, salt, lora, ek := "0", "tenant-a", "sql-adapter", "lora:sql"
	p := &Params{TokensPerBlock: 16}
	for _, in := range s.Inputs {
		switch in {
		case InputHashBlockSize:
			p.HashBlockSize = 8
		case InputPythonHashSeed:
			p.PythonHashSeed = &seed
		case InputCacheSalt:
			p.Scope.CacheSalt = &salt
		case InputLoRAName:
			p.LoRAName = &lora
		case InputMMFeature:
			p.MMFeatures = []MMFeature{{"img-0", 5, 20}}
		case InputExtraKey:
			p.ExtraKey = &ek
		case InputModelKey:
			p.Namespace.ModelKey = "llama"
		case InputWorldSize:
			p.Namespace.WorldSize, p.TPSize = 2, 2
		case InputRank:
			p.Namespace.Rank, p.TPRank = 1, 1
		case InputLayerGroup:
			p.Groups = []LayerGroupPages{{Group: 0, BytesPerPage: 4096}}
		case InputModel:
			p.Model = "meta-llama/Llama-3.1-8B-Instruct"
		case InputNumKVHeads:
			p.NumKVHeads = 8
		case InputPPSize:
			p.PPSize = 2
		case InputKVGroup:
			p.KVGroup = 1
		case InputCachePrefix:
			p.CachePrefix = "prod"
		case InputBackendTag:
			p.BackendTag = "tag"
		}
	}
	return p
}

// TestSchemeGolden pins each scheme's hashes and keys, save and lookup, for one prompt with
// every input it takes set (testdata/schemes/NAME.json; go test -update rewrites them). The
// engines' own vectors are checked by TestEngineKeys*; these catch any byte a change moves.
func TestSchemeGolden(t *testing.T) {
	for _, s := range Schemes() {
		t.Run(s.Name, func(t *testing.T) {
			p := goldenParams(s)
			out := map[string]*Result{}
			for _, set := range []KeySet{KeySetSave, KeySetLookup} {
				r, err := s.Derive(p, goldenPrompt(), set)
				if err != nil {
					t.Fatal(err)
				}
				out[string(set)] = r
			}
			got, err := json.MarshalIndent(out, "", " ")
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", "schemes", s.Name+".json")
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (a new scheme needs its golden file: go test ./core/keys -run TestSchemeGolden -update)", err)
			}
			if strings.TrimSpace(string(want)) != string(got) {
				t.Errorf("%s differs from its golden file %s", s.Name, path)
			}
		})
	}
}

// TestTRTLLMSchemesMatchRecipe checks that the registry's TensorRT-LLM schemes give exactly the
// recipe's hashes and keys (the path the connector runs).
func TestTRTLLMSchemesMatchRecipe(t *testing.T) {
	for _, f := range Formats() {
		s, _ := LookupScheme(string(f))
		p := goldenParams(s)
		if f == FormatTRTLLM || f == FormatBLAKE3 {
			p.PromptLookahead = 3
		}
		if !f.hasFullScope() {
			p.Scope.LoRATaskID, p.Scope.Multimodal = nil, nil
		}
		r, err := s.Derive(p, goldenPrompt(), KeySetLookup)
		if err != nil {
			t.Fatal(err)
		}
		d, err := s.Recipe(p).Derive(Prompt{Tokens: goldenPrompt(), Scope: p.Scope}, KeySetLookup)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Blocks) != len(d.Blocks) || r.Seed.String() != d.Seed.String() {
			t.Fatalf("%s: %d blocks, want %d", f, len(r.Blocks), len(d.Blocks))
		}
		for i := range d.Blocks {
			if r.Blocks[i].Hash.String() != d.Blocks[i].Hash.String() || !slices.Equal(r.Blocks[i].Keys, d.Blocks[i].Keys) || r.Blocks[i].End != d.Blocks[i].End {
				t.Errorf("%s block %d differs", f, i)
			}
		}
	}
}

// TestVLLMChunks checks the chunk rules: with a hash block of 16 under a block of 64, chunk c is
// keyed by the last hash of its four, and a lookup also keys a final partial chunk that ends on
// a hash block; lineage A keys chunk c by hash c.
func TestVLLMChunks(t *testing.T) {
	seed := "0"
	toks := make([]int64, 64*2+40)
	p := &Params{TokensPerBlock: 64, HashBlockSize: 16, PythonHashSeed: &seed, Model: "m"}
	s, _ := LookupScheme("vllm")
	save, err := s.Derive(p, toks, KeySetSave)
	if err != nil {
		t.Fatal(err)
	}
	if len(save.Blocks) != 10 {
		t.Fatalf("%d hash blocks, want 10", len(save.Blocks))
	}
	var keyed []int
	for _, b := range save.KeyedBlocks() {
		keyed = append(keyed, b.Index)
		if !strings.HasSuffix(b.Keys[0], "@"+b.Hash.String()) {
			t.Errorf("block %d key %s", b.Index, b.Keys[0])
		}
	}
	if !slices.Equal(keyed, []int{3, 7}) {
		t.Errorf("save keys blocks %v, want [3 7]", keyed)
	}
	look, _ := s.Derive(p, toks, KeySetLookup)
	kb := look.KeyedBlocks()
	if len(kb) != 3 || kb[2].Index != 9 || kb[2].ChunkStart != 128 || kb[2].ChunkEnd != 160 {
		t.Errorf("lookup chunks %+v", kb)
	}
	a, _ := LookupScheme("vllm-lineage-a")
	ra, err := a.Derive(p, toks, KeySetSave)
	if err != nil {
		t.Fatal(err)
	}
	kb = ra.KeyedBlocks()
	if len(kb) != 2 || kb[0].Index != 0 || kb[1].Index != 1 || kb[1].ChunkStart != 64 {
		t.Errorf("lineage A chunks %+v", kb)
	}
	// Lookup keys cover every rank namespace: TP 4 with 2 KV heads gives key ranks 0 and 1.
	p2 := *p
	p2.TPSize, p2.NumKVHeads, p2.PPSize = 4, 2, 2
	r, err := s.Derive(&p2, toks[:64], KeySetLookup)
	if err != nil {
		t.Fatal(err)
	}
	if k := r.KeyedBlocks()[0].Keys; len(k) != 4 || !strings.Contains(k[3], "@tp_rank:1@pcp0@dcp0@pp_rank:1@") {
		t.Errorf("lookup keys %v", k)
	}
}

// FuzzSchemes checks, for every scheme and arbitrary inputs, that derivation never panics and
// that a prompt's hashes extend those of its prefixes: block i depends only on tokens before
// its end.
func FuzzSchemes(f *testing.F) {
	f.Add(uint8(0), []byte("0123456789abcdef0123456789abcdef"), uint8(4), "s", uint8(1))
	f.Add(uint8(5), make([]byte, 200), uint8(1), "", uint8(0))
	f.Add(uint8(13), []byte{0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, uint8(2), "ab", uint8(3))
	f.Fuzz(func(t *testing.T, which uint8, data []byte, size uint8, str string, cut uint8) {
		all := Schemes()
		s := all[int(which)%len(all)]
		p := goldenParams(s)
		p.TokensPerBlock = 1 + int(size)%32
		if p.HashBlockSize != 0 {
			p.HashBlockSize = p.TokensPerBlock
		}
		if p.Scope.CacheSalt != nil {
			p.Scope.CacheSalt = &str
		}
		if p.LoRAName != nil {
			p.LoRAName = &str
		}
		var toks []int64
		for i := 0; i+2 <= len(data); i += 2 {
			toks = append(toks, int64(data[i])<<8|int64(data[i+1]))
		}
		full, err := s.Derive(p, toks, KeySetSave)
		if err != nil {
			return // bad input (invalid UTF-8 and the like) must only fail
		}
		n := len(toks) * int(cut) / 256
		part, err := s.Derive(p, toks[:n], KeySetSave)
		if err != nil {
			t.Fatalf("%s: the prefix fails where the whole does not: %v", s.Name, err)
		}
		if s.Name == "vllm-v0" {
			return // one hash of the whole prompt
		}
		for i, b := range part.Blocks {
			if i >= len(full.Blocks) || b.Hash.String() != full.Blocks[i].Hash.String() {
				t.Fatalf("%s: block %d of a %d-token prefix differs from the whole prompt's", s.Name, i, n)
			}
		}
	})
}
