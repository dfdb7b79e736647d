package keys

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

const goldenPath = "../../testdata/golden-keys.json"

type goldenFile struct {
	ScopeShard  []scopeShardCase `json:"scope_shard"`
	LookaheadV2 []lookaheadCase  `json:"lookahead_v2"`
	V1Salt      []v1Case         `json:"v1_salt"`
	SeedFormat  struct {
		Description string           `json:"description"`
		Cases       []seedFormatCase `json:"cases"`
	} `json:"seed_format"`
}

type scopeShardCase struct {
	Name                 string          `json:"name"`
	TokensPerBlock       int             `json:"tokens_per_block"`
	Tokens               []json.Number   `json:"tokens"`
	CacheSalt            *string         `json:"cache_salt"`
	LoRATaskID           *json.Number    `json:"lora_task_id"`
	Multimodal           [][]json.Number `json:"multimodal_hashes_int32x8"`
	MultimodalDigestsHex []string        `json:"multimodal_digests_hex"`
	SeedPreimageHex      string          `json:"seed_preimage_hex"`
	SeedHex              string          `json:"seed_hex"`
	FirstBlockPreimage   *string         `json:"first_block_preimage_hex"`
	BlockHashesHex       []string        `json:"block_hashes_hex"`
	Keys                 []struct {
		Namespace      string      `json:"namespace"`
		ModelKey       string      `json:"model_key"`
		ShardKey       string      `json:"shard_key"`
		LayerGroupID   int         `json:"layer_group_id"`
		BytesPerPage   json.Number `json:"bytes_per_page"`
		TokensPerBlock int         `json:"tokens_per_block"`
		Prefix         string      `json:"prefix"`
		Keys           []string    `json:"keys"`
	} `json:"keys"`
}

type rankKeys struct {
	Namespace      string      `json:"namespace"`
	ModelKey       string      `json:"model_key"`
	Rank           int         `json:"rank"`
	WorldSize      int         `json:"world_size"`
	LayerGroupID   int         `json:"layer_group_id"`
	BytesPerPage   json.Number `json:"bytes_per_page"`
	TokensPerBlock int         `json:"tokens_per_block"`
	Prefix         string      `json:"prefix"`
	Keys           []string    `json:"keys"`
}

type lookaheadCase struct {
	Name            string        `json:"name"`
	TokensPerBlock  int           `json:"tokens_per_block"`
	Tokens          []json.Number `json:"tokens"`
	CacheSalt       *string       `json:"cache_salt"`
	PromptLookahead int           `json:"prompt_lookahead"`
	SeedHex         string        `json:"seed_hex"`
	NumFullBlocks   int           `json:"num_full_blocks"`
	BlockTokenSpans [][2]int      `json:"block_token_spans"`
	BlockHashesHex  []string      `json:"block_hashes_hex"`
	Keys            []rankKeys    `json:"keys"`
}

type v1Case struct {
	Name           string        `json:"name"`
	TokensPerBlock int           `json:"tokens_per_block"`
	Tokens         []json.Number `json:"tokens"`
	CacheSalt      *string       `json:"cache_salt"`
	SeedHex        string        `json:"seed_hex"`
	BlockHashesHex []string      `json:"block_hashes_hex"`
	Keys           []rankKeys    `json:"keys"`
}

type seedFormatCase struct {
	Name            string          `json:"name"`
	TokensPerBlock  int             `json:"tokens_per_block"`
	Tokens          []json.Number   `json:"tokens"`
	CacheSalt       *string         `json:"cache_salt"`
	LoRATaskID      *json.Number    `json:"lora_task_id"`
	Multimodal      [][]json.Number `json:"multimodal_hashes_int32x8"`
	PromptLookahead int             `json:"prompt_lookahead"`
	SeedHex         string          `json:"seed_hex"`
	BlockHashesHex  []string        `json:"block_hashes_hex"`
	PageKeys        []string        `json:"page_keys_w4r2_lg1_b65536"`
	GroupKeys       []string        `json:"group_keys_w4"`
}

func loadGolden(t testing.TB) goldenFile {
	t.Helper()
	raw, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var g goldenFile
	if err := dec.Decode(&g); err != nil {
		t.Fatalf("decoding %s: %v", goldenPath, err)
	}
	if len(g.ScopeShard) == 0 || len(g.LookaheadV2) == 0 || len(g.V1Salt) == 0 || len(g.SeedFormat.Cases) == 0 {
		t.Fatalf("%s: a golden section is empty", goldenPath)
	}
	return g
}

func int64s(t testing.TB, ns []json.Number) []int64 {
	t.Helper()
	out := make([]int64, len(ns))
	for i, n := range ns {
		v, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		out[i] = v
	}
	return out
}

func goldenScope(t testing.TB, salt *string, lora *json.Number, mm [][]json.Number) Scope {
	t.Helper()
	s := Scope{CacheSalt: salt}
	if lora != nil {
		v, err := strconv.ParseInt(lora.String(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		s.LoRATaskID = &v
	}
	for _, item := range mm {
		if len(item) != 8 {
			t.Fatalf("multimodal item with %d chunks", len(item))
		}
		var chunks [8]int32
		for i, v := range int64s(t, item) {
			chunks[i] = int32(v)
		}
		s.Multimodal = append(s.Multimodal, MultimodalDigest(chunks))
	}
	return s
}

func hexes(hs []Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.String()
	}
	return out
}

func equalStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %d, want %d:\n got %q\nwant %q", what, len(got), len(want), got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s[%d]: got %s, want %s", what, i, got[i], want[i])
		}
	}
}

// checkChain builds the chain in one call and token by token, and checks both against the
// golden seed and hashes. It returns the hashes.
func checkChain(t *testing.T, cfg ChainConfig, tokens []int64, seedHex string, hashesHex []string) []Hash {
	t.Helper()
	c, err := NewChain(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Seed().String(); got != seedHex {
		t.Errorf("seed: got %s, want %s", got, seedHex)
	}
	got, err := c.Extend(tokens)
	if err != nil {
		t.Fatal(err)
	}
	equalStrings(t, "block hashes", hexes(got), hashesHex)
	if c.Len() != len(hashesHex) || c.Tokens() != len(tokens) {
		t.Errorf("Len %d Tokens %d, want %d %d", c.Len(), c.Tokens(), len(hashesHex), len(tokens))
	}
	inc, _ := NewChain(cfg)
	for i := 0; i <= len(tokens); i++ {
		if _, err := inc.Extend(tokens[:i]); err != nil {
			t.Fatal(err)
		}
	}
	equalStrings(t, "block hashes extended token by token", hexes(inc.Hashes()), hashesHex)
	return got
}

func TestGoldenScopeShard(t *testing.T) {
	for _, tc := range loadGolden(t).ScopeShard {
		t.Run(tc.Name, func(t *testing.T) {
			scope := goldenScope(t, tc.CacheSalt, tc.LoRATaskID, tc.Multimodal)
			equalStrings(t, "multimodal digests", func() []string {
				var out []string
				for _, d := range scope.Multimodal {
					out = append(out, hex.EncodeToString(d[:]))
				}
				return out
			}(), tc.MultimodalDigestsHex)
			if got := hex.EncodeToString(SeedPreimage(FormatTRTLLM, scope)); got != tc.SeedPreimageHex {
				t.Errorf("seed preimage: got %s, want %s", got, tc.SeedPreimageHex)
			}
			tokens := int64s(t, tc.Tokens)
			cfg := ChainConfig{Format: FormatTRTLLM, TokensPerBlock: tc.TokensPerBlock, Scope: scope}
			hs := checkChain(t, cfg, tokens, tc.SeedHex, tc.BlockHashesHex)
			if tc.FirstBlockPreimage != nil {
				c, _ := NewChain(cfg)
				seed := c.Seed()
				pre := append(seed[:], encode(nil, tokens[:tc.TokensPerBlock])...)
				if got := hex.EncodeToString(pre); got != *tc.FirstBlockPreimage {
					t.Errorf("first block preimage: got %s, want %s", got, *tc.FirstBlockPreimage)
				}
			}
			if len(tc.Keys) == 0 {
				t.Fatal("case has no keys")
			}
			for _, k := range tc.Keys {
				bpp, err := strconv.ParseUint(k.BytesPerPage.String(), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				ns := Namespace{Namespace: k.Namespace, ModelKey: k.ModelKey, WorldSize: 1}
				var keys []string
				if k.ShardKey == ReplicatedShard {
					for _, h := range hs {
						keys = append(keys, ns.ReplicatedPageKey(k.LayerGroupID, k.TokensPerBlock, bpp, h))
					}
				} else {
					if _, err := fmt.Sscanf(k.ShardKey, "w%dr%d", &ns.WorldSize, &ns.Rank); err != nil {
						t.Fatalf("shard key %q: %v", k.ShardKey, err)
					}
					if err := ns.Validate(); err != nil {
						t.Fatal(err)
					}
					if ns.Shard() != k.ShardKey {
						t.Errorf("shard: got %s, want %s", ns.Shard(), k.ShardKey)
					}
					for _, h := range hs {
						keys = append(keys, ns.PageKey(k.LayerGroupID, k.TokensPerBlock, bpp, h))
					}
				}
				equalStrings(t, k.Prefix, keys, k.Keys)
				for i, key := range keys {
					if want := k.Prefix + "/" + tc.BlockHashesHex[i]; key != want {
						t.Errorf("key %s does not extend prefix: want %s", key, want)
					}
				}
			}
		})
	}
}

func checkRankKeys(t *testing.T, ks []rankKeys, hs []Hash) {
	t.Helper()
	if len(ks) == 0 {
		t.Fatal("case has no keys")
	}
	for _, k := range ks {
		bpp, err := strconv.ParseUint(k.BytesPerPage.String(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		ns := Namespace{Namespace: k.Namespace, ModelKey: k.ModelKey, WorldSize: k.WorldSize, Rank: k.Rank}
		if err := ns.Validate(); err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, h := range hs {
			keys = append(keys, ns.PageKey(k.LayerGroupID, k.TokensPerBlock, bpp, h))
		}
		equalStrings(t, "keys", keys, k.Keys)
	}
}

func TestGoldenLookaheadV2(t *testing.T) {
	for _, tc := range loadGolden(t).LookaheadV2 {
		t.Run(tc.Name, func(t *testing.T) {
			cfg := ChainConfig{
				Format:          FormatTRTLLMLookaheadV2,
				TokensPerBlock:  tc.TokensPerBlock,
				PromptLookahead: tc.PromptLookahead,
				Scope:           Scope{CacheSalt: tc.CacheSalt},
			}
			tokens := int64s(t, tc.Tokens)
			hs := checkChain(t, cfg, tokens, tc.SeedHex, tc.BlockHashesHex)
			if len(hs) != tc.NumFullBlocks {
				t.Errorf("blocks: got %d, want %d", len(hs), tc.NumFullBlocks)
			}
			c, _ := NewChain(cfg)
			if len(tc.BlockTokenSpans) != tc.NumFullBlocks {
				t.Fatalf("golden case has %d spans for %d blocks", len(tc.BlockTokenSpans), tc.NumFullBlocks)
			}
			for i, span := range tc.BlockTokenSpans {
				if s, e := c.BlockSpan(i); s != span[0] || e != span[1] {
					t.Errorf("span %d: got [%d,%d), want [%d,%d)", i, s, e, span[0], span[1])
				}
			}
			checkRankKeys(t, tc.Keys, hs)
		})
	}
}

func TestGoldenV1Salt(t *testing.T) {
	for _, tc := range loadGolden(t).V1Salt {
		t.Run(tc.Name, func(t *testing.T) {
			cfg := ChainConfig{Format: FormatTRTLLMV1, TokensPerBlock: tc.TokensPerBlock, Scope: Scope{CacheSalt: tc.CacheSalt}}
			hs := checkChain(t, cfg, int64s(t, tc.Tokens), tc.SeedHex, tc.BlockHashesHex)
			checkRankKeys(t, tc.Keys, hs)
		})
	}
}

func TestGoldenSeedFormat(t *testing.T) {
	g := loadGolden(t)
	ns := Namespace{ModelKey: "llama-3-8b", WorldSize: 4, Rank: 2}
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range g.SeedFormat.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			cfg := ChainConfig{
				TokensPerBlock:  tc.TokensPerBlock,
				PromptLookahead: tc.PromptLookahead,
				Scope:           goldenScope(t, tc.CacheSalt, tc.LoRATaskID, tc.Multimodal),
			}
			tokens := int64s(t, tc.Tokens)
			hs := checkChain(t, cfg, tokens, tc.SeedHex, tc.BlockHashesHex)
			if want := max(0, len(tokens)-tc.PromptLookahead) / tc.TokensPerBlock; len(hs) != want {
				t.Errorf("blocks: got %d, want max(0,len-L)/T = %d", len(hs), want)
			}
			var pages, groups []string
			for _, h := range hs {
				pages = append(pages, ns.PageKey(1, tc.TokensPerBlock, 65536, h))
				groups = append(groups, ns.GroupKey(h))
			}
			equalStrings(t, "page keys", pages, tc.PageKeys)
			equalStrings(t, "group keys", groups, tc.GroupKeys)
		})
	}
}

// TestGoldenCopyIsCurrent checks that the repository's copy of the golden vectors is the shared
// file it was taken from, wherever the shared directory sits beside the checkout (it does in
// development and in CI). The vectors are a wire format: a stale copy would test the wrong bytes.
func TestGoldenCopyIsCurrent(t *testing.T) {
	shared := filepath.Join("..", "..", "..", "shared", "testdata", "golden-keys.json")
	want, err := os.ReadFile(shared)
	if errors.Is(err, fs.ErrNotExist) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not beside this checkout: CI runs with ../shared beside it", shared)
		}
		t.Skipf("%s is not beside this checkout", shared)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from %s: copy the shared file again", goldenPath, shared)
	}
}
