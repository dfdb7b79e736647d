package keys

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
)

// derive runs the recipe and checks what every derivation must hold: the seed, the block
// hashes and spans of a chain built directly, and the uncovered tail.
func derive(t *testing.T, r Recipe, p Prompt, set KeySet, seedHex string, hashesHex []string) *Derivation {
	t.Helper()
	d, err := r.Derive(p, set)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Seed.String(); got != seedHex {
		t.Errorf("seed: got %s, want %s", got, seedHex)
	}
	var got []string
	for i, b := range d.Blocks {
		got = append(got, b.Hash.String())
		if b.Index != i || b.Start != i*r.TokensPerBlock || b.End != (i+1)*r.TokensPerBlock+r.PromptLookahead {
			t.Errorf("block %d: index %d span [%d,%d)", i, b.Index, b.Start, b.End)
		}
	}
	equalStrings(t, "block hashes", got, hashesHex)
	if want := len(p.Tokens) - len(hashesHex)*r.TokensPerBlock; d.UncoveredTokens != want {
		t.Errorf("uncovered tokens: got %d, want %d", d.UncoveredTokens, want)
	}
	return d
}

// blockKey returns key k of every block of d.
func blockKey(t *testing.T, d *Derivation, k int) []string {
	t.Helper()
	var out []string
	for i, b := range d.Blocks {
		if k >= len(b.Keys) {
			t.Fatalf("block %d has %d keys, want key %d", i, len(b.Keys), k)
		}
		out = append(out, b.Keys[k])
	}
	return out
}

func bytesPerPage(t *testing.T, n fmt.Stringer) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(n.String(), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestRecipeGoldenSeedFormat: the recipe gives kvctl's default-format golden page and group
// keys for rank 2 of 4 in layer group 1.
func TestRecipeGoldenSeedFormat(t *testing.T) {
	for _, tc := range loadGolden(t).SeedFormat.Cases {
		t.Run(tc.Name, func(t *testing.T) {
			r := Recipe{
				TokensPerBlock: tc.TokensPerBlock, PromptLookahead: tc.PromptLookahead,
				Namespace: Namespace{ModelKey: "llama-3-8b", WorldSize: 4, Rank: 2},
				Groups:    []LayerGroupPages{{Group: 1, BytesPerPage: 65536}},
			}
			p := Prompt{Tokens: int64s(t, tc.Tokens), Scope: goldenScope(t, tc.CacheSalt, tc.LoRATaskID, tc.Multimodal)}
			d := derive(t, r, p, KeySetSave, tc.SeedHex, tc.BlockHashesHex)
			equalStrings(t, "page keys", blockKey(t, d, 0), tc.PageKeys)
			var groups []string
			for _, b := range d.Blocks {
				groups = append(groups, b.GroupKey)
				if len(b.Keys) != 1 {
					t.Errorf("block %d: %d save keys, want 1", b.Index, len(b.Keys))
				}
			}
			equalStrings(t, "group keys", groups, tc.GroupKeys)
			// A lookup needs the page of every shard; this rank's own is the one it saves.
			l := derive(t, r, p, KeySetLookup, tc.SeedHex, tc.BlockHashesHex)
			equalStrings(t, "this rank's lookup key", blockKey(t, l, 2), tc.PageKeys)
			for _, b := range l.Blocks {
				if len(b.Keys) != r.LookupKeysPerBlock() || len(b.Keys) != 4 {
					t.Errorf("block %d: %d lookup keys, LookupKeysPerBlock %d, want 4", b.Index, len(b.Keys), r.LookupKeysPerBlock())
				}
				if got := r.AppendLookupKeys(nil, b.Hash); !slices.Equal(got, b.Keys) {
					t.Errorf("block %d: AppendLookupKeys %q, Derive %q", b.Index, got, b.Keys)
				}
			}
		})
	}
}

// TestRecipeGoldenScopeShard: the recipe's lookup keys hold TensorRT-LLM's golden sharded and
// replicated keys where BlockKeys orders them, and a rank saves its own shard's key.
func TestRecipeGoldenScopeShard(t *testing.T) {
	for _, tc := range loadGolden(t).ScopeShard {
		t.Run(tc.Name, func(t *testing.T) {
			p := Prompt{Tokens: int64s(t, tc.Tokens), Scope: goldenScope(t, tc.CacheSalt, tc.LoRATaskID, tc.Multimodal)}
			var sharded, replicated []int
			for i, k := range tc.Keys {
				if k.ShardKey == ReplicatedShard {
					replicated = append(replicated, i)
				} else {
					sharded = append(sharded, i)
				}
			}
			if len(sharded) == 0 || len(replicated) == 0 {
				t.Fatal("golden case lacks a sharded or a replicated key")
			}
			for _, si := range sharded {
				k := tc.Keys[si]
				ns := Namespace{Namespace: k.Namespace, ModelKey: k.ModelKey}
				if _, err := fmt.Sscanf(k.ShardKey, "w%dr%d", &ns.WorldSize, &ns.Rank); err != nil {
					t.Fatal(err)
				}
				g := LayerGroupPages{Group: k.LayerGroupID, BytesPerPage: bytesPerPage(t, k.BytesPerPage)}
				for _, ri := range replicated {
					if rk := tc.Keys[ri]; rk.ModelKey == k.ModelKey && rk.LayerGroupID == k.LayerGroupID {
						g.ReplicatedBytesPerPage = bytesPerPage(t, rk.BytesPerPage)
					}
				}
				r := Recipe{Format: FormatTRTLLM, TokensPerBlock: k.TokensPerBlock, Namespace: ns, Groups: []LayerGroupPages{g}}
				save := derive(t, r, p, KeySetSave, tc.SeedHex, tc.BlockHashesHex)
				equalStrings(t, k.Prefix+" saved", blockKey(t, save, 0), k.Keys)
				lookup := derive(t, r, p, KeySetLookup, tc.SeedHex, tc.BlockHashesHex)
				equalStrings(t, k.Prefix+" looked up", blockKey(t, lookup, ns.Rank), k.Keys)
				if g.ReplicatedBytesPerPage == 0 {
					continue
				}
				for _, ri := range replicated {
					if rk := tc.Keys[ri]; rk.ModelKey == k.ModelKey && rk.LayerGroupID == k.LayerGroupID {
						equalStrings(t, rk.Prefix+" looked up", blockKey(t, lookup, ns.WorldSize), rk.Keys)
					}
				}
			}
		})
	}
}

// TestRecipeGoldenBranches: the recipe gives the golden keys of the older formats.
func TestRecipeGoldenBranches(t *testing.T) {
	g := loadGolden(t)
	check := func(t *testing.T, f Format, lookahead int, tokens []int64, salt *string, seedHex string, hashesHex []string, ks []rankKeys) {
		if len(ks) == 0 {
			t.Fatal("case has no keys")
		}
		for _, k := range ks {
			r := Recipe{
				Format: f, TokensPerBlock: k.TokensPerBlock, PromptLookahead: lookahead,
				Namespace: Namespace{Namespace: k.Namespace, ModelKey: k.ModelKey, WorldSize: k.WorldSize, Rank: k.Rank},
				Groups:    []LayerGroupPages{{Group: k.LayerGroupID, BytesPerPage: bytesPerPage(t, k.BytesPerPage)}},
			}
			d := derive(t, r, Prompt{Tokens: tokens, Scope: Scope{CacheSalt: salt}}, KeySetSave, seedHex, hashesHex)
			equalStrings(t, "keys", blockKey(t, d, 0), k.Keys)
		}
	}
	for _, tc := range g.LookaheadV2 {
		t.Run(tc.Name, func(t *testing.T) {
			check(t, FormatTRTLLMLookaheadV2, tc.PromptLookahead, int64s(t, tc.Tokens), tc.CacheSalt, tc.SeedHex, tc.BlockHashesHex, tc.Keys)
		})
	}
	for _, tc := range g.V1Salt {
		t.Run(tc.Name, func(t *testing.T) {
			check(t, FormatTRTLLMV1, 0, int64s(t, tc.Tokens), tc.CacheSalt, tc.SeedHex, tc.BlockHashesHex, tc.Keys)
		})
	}
}

func TestRecipeDeriveRefuses(t *testing.T) {
	ok := Recipe{TokensPerBlock: 4, Namespace: Namespace{ModelKey: "m", WorldSize: 1}, Groups: []LayerGroupPages{{Group: 0, BytesPerPage: 4096}}}
	tokens := []int64{0, 1, 2, 3, 4, 5, 6, 7, 8}
	noGroups := ok
	noGroups.Groups = nil
	badRank := ok
	badRank.Namespace.Rank = 1
	for _, tc := range []struct {
		name string
		r    Recipe
		set  KeySet
		want error
	}{
		{"no layer group", noGroups, KeySetLookup, ErrNoLayerGroups},
		{"unknown format", Recipe{Format: "sha1", TokensPerBlock: 4}, KeySetNone, ErrUnknownFormat},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tc.r.Derive(Prompt{Tokens: tokens}, tc.set); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := badRank.Derive(Prompt{Tokens: tokens}, KeySetSave); err == nil {
		t.Fatal("rank 1 of 1: no error")
	}
	if _, err := ok.Derive(Prompt{Tokens: tokens}, "all"); err == nil {
		t.Fatal("key set all: no error")
	}
	// Hashes need no namespace or layer group.
	d, err := noGroups.Derive(Prompt{Tokens: tokens}, KeySetNone)
	if err != nil || len(d.Blocks) != 2 || d.UncoveredTokens != 1 || d.Blocks[0].Keys != nil || d.Blocks[0].GroupKey != "" {
		t.Fatalf("hashes only: %+v, %v", d, err)
	}
	// A multimodal prompt without digests gets nothing, as the connector bypasses it.
	d, err = ok.Derive(Prompt{Tokens: tokens, HasMultimodal: true}, KeySetLookup)
	if err != nil || !d.Bypassed || len(d.Blocks) != 0 || d.UncoveredTokens != len(tokens) {
		t.Fatalf("bypassed: %+v, %v", d, err)
	}
	d, err = ok.Derive(Prompt{Tokens: tokens, HasMultimodal: true, Scope: Scope{Multimodal: [][MultimodalDigestSize]byte{{1}}}}, KeySetLookup)
	if err != nil || d.Bypassed || len(d.Blocks) != 2 {
		t.Fatalf("multimodal with a digest: %+v, %v", d, err)
	}
}
