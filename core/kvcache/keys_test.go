package kvcache

import (
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

// A prompt's reuse scope keeps local blocks apart as it keeps pool keys apart: the same tokens
// under another cache salt or LoRA adapter match nothing, under the same scope they match, and
// a partial tail block is matched only under the scope and prefix it was cached with.
func TestManagerKeysByScope(t *testing.T) {
	const T = 4
	salt, other := "tenant-a", "tenant-b"
	lora := int64(7)
	tokens := seq(10, 5*T+2)
	scopes := map[string]keys.Scope{
		"none":          {},
		"salt":          {CacheSalt: &salt},
		"other salt":    {CacheSalt: &other},
		"lora":          {LoRATaskID: &lora},
		"salt and lora": {CacheSalt: &salt, LoRATaskID: &lora},
	}
	for cached, cs := range scopes {
		m := newManager(t, Config{TokensPerBlock: T, Pools: pools(64), EnablePartialReuse: true}, nil, Options{})
		p := Prompt{Tokens: tokens, Scope: cs}
		if _, err := m.Allocate(1, p, len(tokens)); err != nil {
			t.Fatal(err)
		}
		if err := m.Commit(1, tokens); err != nil {
			t.Fatal(err)
		}
		if err := m.Free(1); err != nil {
			t.Fatal(err)
		}
		for asked, as := range scopes {
			// One token past the cached prompt, so the whole cached prompt, partial tail
			// included, may be reused.
			q := Prompt{Tokens: append(append([]int64(nil), tokens...), 99), Scope: as}
			mr, err := m.Match(q)
			if err != nil {
				t.Fatal(err)
			}
			want := 0
			if asked == cached {
				want = len(tokens)
			}
			if mr.Tokens != want {
				t.Errorf("cached under %q, asked under %q: matched %d tokens, want %d", cached, asked, mr.Tokens, want)
			}
		}
	}
}

// The manager's block keys are the connector's chain: the keys of a request's full blocks are
// what keys.Chain derives for the same tokens and scope.
func TestManagerKeysAreTheChain(t *testing.T) {
	const T = 4
	salt := "s"
	p := Prompt{Tokens: seq(1, 3*T+1), Scope: keys.Scope{CacheSalt: &salt}}
	m := newManager(t, Config{TokensPerBlock: T, Pools: pools(16)}, nil, Options{})
	if _, err := m.Allocate(1, p, len(p.Tokens)); err != nil {
		t.Fatal(err)
	}
	c, err := keys.NewChain(keys.ChainConfig{TokensPerBlock: T, Scope: p.Scope})
	if err != nil {
		t.Fatal(err)
	}
	want, err := c.Extend(p.Tokens)
	if err != nil {
		t.Fatal(err)
	}
	got := m.reqs[1].keys
	if len(got) != 3 || len(want) != 3 {
		t.Fatalf("%d keys, chain %d; want 3 full blocks", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("block %d: manager key %s, chain %s", i, got[i], want[i])
		}
	}
}
