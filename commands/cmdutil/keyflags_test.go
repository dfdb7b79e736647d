package cmdutil

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

func TestKeyFlagsRecipe(t *testing.T) {
	base := func() *KeyFlags {
		return &KeyFlags{Format: "trtllm", TokensPerBlock: 4, Namespace: "ns", ModelKey: "m", WorldSize: 2, Rank: 1,
			LayerGroups: []string{"1:128KiB", "0:64"}, Replicated: []string{"1:16"}}
	}
	rec, scope, err := base().Recipe()
	if err != nil {
		t.Fatal(err)
	}
	want := []keys.LayerGroupPages{{Group: 1, BytesPerPage: 128 << 10, ReplicatedBytesPerPage: 16}, {Group: 0, BytesPerPage: 64}}
	if !slices.Equal(rec.Groups, want) || rec.Format != keys.FormatTRTLLM || rec.Namespace.Shard() != "w2r1" || scope.CacheSalt != nil || scope.LoRATaskID != nil {
		t.Fatalf("recipe %+v scope %+v", rec, scope)
	}
	if err := CheckKeys(rec); err != nil {
		t.Fatal(err)
	}
	salted := base()
	salted.CacheSalt, salted.HasCacheSalt, salted.LoRAID, salted.HasLoRAID = "", true, 0, true
	if _, s, err := salted.Recipe(); err != nil || s.CacheSalt == nil || s.LoRATaskID == nil {
		t.Fatalf("an explicit empty salt and LoRA 0 are part of the scope: %+v, %v", s, err)
	}

	for _, tt := range []struct {
		name  string
		edit  func(*KeyFlags)
		check bool // the error comes from CheckKeys, not Recipe
		want  string
	}{
		{"format", func(k *KeyFlags) { k.Format = "sha1" }, false, "--format: unknown format"},
		{"tokens per block", func(k *KeyFlags) { k.TokensPerBlock = 0 }, false, "--tokens-per-block 0: want 1 to 65536"},
		{"world size", func(k *KeyFlags) { k.WorldSize = 2000000000 }, false, "--world-size 2000000000: want 1 to 4096"},
		{"layer group twice", func(k *KeyFlags) { k.LayerGroups = []string{"0:64", "0:32"} }, false, `--layer-group "0:32": layer group 0 given twice`},
		{"replicated without its group", func(k *KeyFlags) { k.Replicated = []string{"5:16"} }, false, `--replicated "5:16": layer group 5 has no --layer-group`},
		{"page size", func(k *KeyFlags) { k.LayerGroups = []string{"0:0"} }, false, "page size must be a positive number of bytes"},
		{"pair", func(k *KeyFlags) { k.LayerGroups = []string{"64"} }, false, "want g:bytes_per_page"},
		{"mm hash", func(k *KeyFlags) { k.MMHashes = []string{"1,2"} }, false, "--mm-hash #1"},
		{"no layer group", func(k *KeyFlags) { k.LayerGroups, k.Replicated = nil, nil }, true, "keys need at least one --layer-group g:bytes_per_page"},
		{"rank", func(k *KeyFlags) { k.Rank = 2 }, true, "rank 2: must be in [0, 2)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := base()
			tt.edit(k)
			rec, _, err := k.Recipe()
			if tt.check {
				if err != nil {
					t.Fatalf("Recipe: %v", err)
				}
				err = CheckKeys(rec)
			}
			var fe *FlagError
			if !errors.As(err, &fe) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
}

func TestParseMMFeature(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want keys.MMFeature
		err  bool
	}{
		{in: "img-0:2:10", want: keys.MMFeature{Identifier: "img-0", Offset: 2, Length: 10}},
		{in: "sha256:abc:14:30", want: keys.MMFeature{Identifier: "sha256:abc", Offset: 14, Length: 30}},
		{in: ":0:0", want: keys.MMFeature{}},
		{in: "img:2", err: true},
		{in: "img:-1:3", err: true},
		{in: "img:x:3", err: true},
	} {
		got, err := ParseMMFeature(tt.in)
		if (err != nil) != tt.err || (!tt.err && got != tt.want) {
			t.Errorf("%q: %+v, %v", tt.in, got, err)
		}
	}
}

func FuzzParseMMFeature(f *testing.F) {
	f.Add("img-0:2:10")
	f.Add("a:b:c:1:2")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMMFeature(s)
		if err != nil {
			return
		}
		if m.Offset < 0 || m.Length < 0 || !strings.HasPrefix(s, m.Identifier) {
			t.Fatalf("%q: %+v", s, m)
		}
	})
}
