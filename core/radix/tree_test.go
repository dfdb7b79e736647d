package radix

import (
	"errors"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{{TokensPerBlock: 0}, {TokensPerBlock: MaxTokensPerBlock + 1}, {TokensPerBlock: 4, PartialScanLimit: -1}, {TokensPerBlock: 4, SizeHint: -1}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err = %v, want ErrConfig", cfg, err)
		}
	}
}

func TestInsertDuplicate(t *testing.T) {
	tr := mustTree(t, Config{TokensPerBlock: 4})
	b := blocksOf(seq(0, 4), 4)[0]
	id1, out, err := tr.Insert(Root, b)
	if err != nil || out != Inserted {
		t.Fatalf("first insert: %v %v", out, err)
	}
	id2, out, err := tr.Insert(Root, b)
	if err != nil || out != Duplicate || id2 != id1 {
		t.Fatalf("second insert: id %d outcome %v err %v, want %d duplicate", id2, out, err, id1)
	}
	if tr.Len() != 1 {
		t.Fatalf("Len = %d", tr.Len())
	}
	// The same key under another parent is not a chain.
	other, _, _ := tr.Insert(Root, blocksOf(seq(10, 4), 4)[0])
	if _, _, err := tr.Insert(other, b); !errors.Is(err, ErrKeyConflict) {
		t.Fatalf("key under another parent: %v", err)
	}
}

func TestInsertUselessPrefix(t *testing.T) {
	const T = 8
	for _, store := range []bool{false, true} {
		tr := mustTree(t, Config{TokensPerBlock: T, StoreTokens: store})
		long := commit(t, tr, seq(0, T+6))
		short := blocksOf(seq(0, T+3), T)
		id, out, err := tr.Insert(long[0], short[1])
		if err != nil || out != Useless || id != long[1] {
			t.Fatalf("store %v: id %d outcome %v err %v, want the longer sibling %d", store, id, out, err, long[1])
		}
		if tr.Len() != 2 {
			t.Fatalf("Len = %d, want 2", tr.Len())
		}
		must(t, tr.Check())
	}
	// A partial block that is a prefix of a full sibling is useless when full tokens are kept.
	tr := mustTree(t, Config{TokensPerBlock: T, StoreTokens: true})
	full := commit(t, tr, seq(0, 2*T))
	id, out, _ := tr.Insert(full[0], blocksOf(seq(0, T+5), T)[1])
	if out != Useless || id != full[1] {
		t.Fatalf("prefix of a full sibling: %v %d", out, id)
	}
}

func TestInsertReplacesPartialSibling(t *testing.T) {
	const T = 8
	tr := mustTree(t, Config{TokensPerBlock: T})
	short := commit(t, tr, seq(0, T+3))
	must(t, tr.Acquire(short...))
	longer := blocksOf(seq(0, T+6), T)
	id, out, err := tr.Insert(short[0], longer[1])
	if err != nil || out != Replaced || id != short[1] {
		t.Fatalf("id %d outcome %v err %v, want %d replaced", id, out, err, short[1])
	}
	info, _ := tr.Info(id)
	if info.NumTokens != 6 || info.Key != longer[1].Key || info.Refs != 1 {
		t.Fatalf("replaced node %+v: want 6 tokens, the new key and the old reference", info)
	}
	if _, ok := tr.Lookup(blocksOf(seq(0, T+3), T)[1].Key); ok {
		t.Fatal("old partial key still indexed")
	}
	// A full block replaces it too, and then it can take children.
	full := blocksOf(seq(0, 3*T), T)
	id2, out, _ := tr.Insert(short[0], full[1])
	if out != Replaced || id2 != id {
		t.Fatalf("full over partial: %v %d", out, id2)
	}
	if _, err := tr.InsertChain(nil, id2, full[2:]); err != nil {
		t.Fatal(err)
	}
	m, _ := tr.Match(queryOf(seq(0, 3*T), T), MatchOptions{})
	if m.Tokens != 3*T {
		t.Fatalf("Tokens = %d after replacement", m.Tokens)
	}
	must(t, tr.Check())
}

func TestInsertRefusals(t *testing.T) {
	const T = 8
	tr := mustTree(t, Config{TokensPerBlock: T})
	ids := commit(t, tr, seq(0, T+3))
	if _, _, err := tr.Insert(ids[1], Block{Key: keys.Hash{1}, NumTokens: T}); !errors.Is(err, ErrPartialParent) {
		t.Errorf("child of a partial block: %v", err)
	}
	if _, _, err := tr.Insert(Root, Block{Key: keys.Hash{2}, NumTokens: 3}); !errors.Is(err, ErrBadBlock) {
		t.Errorf("partial block without tokens: %v", err)
	}
	if _, _, err := tr.Insert(Root, Block{Key: keys.Hash{3}, NumTokens: T + 1}); !errors.Is(err, ErrBadBlock) {
		t.Errorf("oversized block: %v", err)
	}
	if _, _, err := tr.Insert(Root, Block{Key: keys.Hash{4}, Tokens: seq(0, 2), NumTokens: 3}); !errors.Is(err, ErrBadBlock) {
		t.Errorf("inconsistent token count: %v", err)
	}
	if _, _, err := tr.Insert(NodeID(999), Block{Key: keys.Hash{5}, NumTokens: T}); !errors.Is(err, ErrNoNode) {
		t.Errorf("unknown parent: %v", err)
	}
}

func TestReferencesAndLRU(t *testing.T) {
	const T = 4
	tr := mustTree(t, Config{TokensPerBlock: T})
	a := commit(t, tr, seq(0, 3*T))   // a0 a1 a2
	b := commit(t, tr, seq(100, 2*T)) // b0 b1
	if tr.Evictable() != 2 {
		t.Fatalf("Evictable = %d, want 2 leaves", tr.Evictable())
	}
	tr.Touch(a...)
	must(t, tr.Acquire(b[1]))
	var order []NodeID
	n := tr.Evict(10, func(id NodeID) { order = append(order, id) })
	// b1 is pinned, so b0 is not a leaf; a2, a1, a0 go, leaf by leaf.
	if n != 3 || len(order) != 3 || order[0] != a[2] || order[1] != a[1] || order[2] != a[0] {
		t.Fatalf("evicted %v, want %v", order, []NodeID{a[2], a[1], a[0]})
	}
	if err := tr.Release(b[1], b[1]); !errors.Is(err, ErrNotReferenced) {
		t.Fatalf("double release: %v", err)
	}
	if info, _ := tr.Info(b[1]); info.Refs != 1 {
		t.Fatalf("refused release changed refs to %d", info.Refs)
	}
	must(t, tr.Release(b[1]))
	if err := tr.Release(b[1]); !errors.Is(err, ErrNotReferenced) {
		t.Fatalf("release below zero: %v", err)
	}
	if tr.Evict(10, nil) != 2 || tr.Len() != 0 {
		t.Fatalf("Len = %d after evicting everything", tr.Len())
	}
	must(t, tr.Check())
}

func TestLRUOrderFollowsUse(t *testing.T) {
	tr := mustTree(t, Config{TokensPerBlock: 2})
	x := commit(t, tr, seq(0, 2))
	y := commit(t, tr, seq(10, 2))
	z := commit(t, tr, seq(20, 2))
	tr.Touch(x...)
	var order []NodeID
	tr.Evict(3, func(id NodeID) { order = append(order, id) })
	if order[0] != y[0] || order[1] != z[0] || order[2] != x[0] {
		t.Fatalf("order %v, want y z x", order)
	}
}

func TestRemove(t *testing.T) {
	tr := mustTree(t, Config{TokensPerBlock: 2})
	ids := commit(t, tr, seq(0, 4))
	if err := tr.Remove(ids[0]); !errors.Is(err, ErrInUse) {
		t.Fatalf("remove inner node: %v", err)
	}
	must(t, tr.Remove(ids[1]))
	if err := tr.Remove(ids[1]); !errors.Is(err, ErrNoNode) {
		t.Fatalf("remove twice: %v", err)
	}
	if err := tr.Remove(Root); !errors.Is(err, ErrInUse) {
		t.Fatalf("remove root: %v", err)
	}
	must(t, tr.Check())
}

func TestManyChildrenUseIndex(t *testing.T) {
	const T = 2
	tr := mustTree(t, Config{TokensPerBlock: T})
	for i := 0; i < 200; i++ {
		commit(t, tr, []int64{int64(i), 0, 5, 5})
	}
	for i := 0; i < 200; i += 7 {
		m, _ := tr.Match(queryOf([]int64{int64(i), 0, 5, 5}, T), MatchOptions{})
		if m.Tokens != 4 {
			t.Fatalf("prompt %d: Tokens = %d", i, m.Tokens)
		}
	}
	m, _ := tr.Match(queryOf([]int64{500, 0}, T), MatchOptions{})
	if m.Tokens != 0 {
		t.Fatalf("absent prompt matched %d", m.Tokens)
	}
	for evicted := 1; evicted == 1; {
		evicted = tr.Evict(1, nil)
	}
	must(t, tr.Check())
}

func TestSetCoverageBounds(t *testing.T) {
	tr := mustTree(t, Config{TokensPerBlock: 4})
	ids := commit(t, tr, seq(0, 4))
	if err := tr.SetCoverage(ids[0], Coverage{Attention: 5}); !errors.Is(err, ErrBadBlock) {
		t.Fatalf("coverage past the block: %v", err)
	}
	if err := tr.SetCoverage(Root, Coverage{}); !errors.Is(err, ErrNoNode) {
		t.Fatalf("coverage of the root: %v", err)
	}
}
