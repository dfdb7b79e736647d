package radix

import (
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

// Blocks of different reuse scopes are never compared by content: a partial match and the
// sibling prefix rules of Insert stay within one scope.
func TestScopeKeepsContentApart(t *testing.T) {
	const T = 4
	a, b := keys.Hash{1}, keys.Hash{2}
	tr := mustTree(t, Config{TokensPerBlock: T, StoreTokens: true})
	toks := []int64{5, 6, 7}
	id, out, err := tr.Insert(Root, Block{Key: keys.Hash{0xa}, Tokens: toks, Scope: a})
	if err != nil || out != Inserted {
		t.Fatalf("insert: %v %v", out, err)
	}
	// The same partial tokens under another scope are a block of their own, not Useless.
	id2, out, err := tr.Insert(Root, Block{Key: keys.Hash{0xb}, Tokens: toks[:2], Scope: b})
	if err != nil || out != Inserted || id2 == id {
		t.Fatalf("insert under another scope: %v %v (first node %d, got %d)", out, err, id, id2)
	}
	// Under the first scope they are a prefix of the first block: Useless.
	if got, out, err := tr.Insert(Root, Block{Key: keys.Hash{0xc}, Tokens: toks[:2], Scope: a}); err != nil || out != Useless || got != id {
		t.Fatalf("insert of a prefix under the same scope: %v %v node %d, want useless %d", out, err, got, id)
	}
	for _, tc := range []struct {
		scope keys.Hash
		want  int
	}{{a, 3}, {b, 2}, {keys.Hash{3}, 0}} {
		m, err := tr.Match(Query{Tokens: []int64{5, 6, 7, 8, 9}, Scope: tc.scope}, MatchOptions{PartialReuse: true})
		if err != nil {
			t.Fatal(err)
		}
		if m.RawTokens != tc.want {
			t.Errorf("scope %x: matched %d tokens by content, want %d", tc.scope[:1], m.RawTokens, tc.want)
		}
	}
}
