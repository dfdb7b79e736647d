package radix

import (
	"reflect"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
)

func chainOf(ids ...int) []keys.Hash {
	out := make([]keys.Hash, len(ids))
	var parent keys.Hash
	for i, v := range ids {
		parent = chainKey(parent, []int64{int64(v)})
		out[i] = parent
	}
	return out
}

func TestPoolIndexHoles(t *testing.T) {
	p := NewPoolIndex(0)
	c := chainOf(1, 2, 3, 4, 5, 6)
	if n, err := p.Insert(c); err != nil || n != 6 {
		t.Fatalf("Insert: %d %v", n, err)
	}
	if got := p.Probe(c); !reflect.DeepEqual(got, ProbeResult{Hit: 6}) {
		t.Fatalf("full probe %+v", got)
	}
	if !p.Remove(c[1]) || !p.Remove(c[2]) || !p.Remove(c[4]) {
		t.Fatal("Remove reported a block as not held")
	}
	if p.Remove(c[1]) {
		t.Fatal("second Remove reported the block as held")
	}
	want := ProbeResult{Hit: 1, Holes: []Hole{{Start: 1, Len: 2}, {Start: 4, Len: 1}}, BehindHoles: 2}
	if got := p.Probe(c); !reflect.DeepEqual(got, want) {
		t.Fatalf("probe %+v, want %+v", got, want)
	}
	if p.Len() != 3 || p.Nodes() != 6 {
		t.Fatalf("Len %d Nodes %d, want 3 and 6", p.Len(), p.Nodes())
	}
	// Dropping the tail leaves the hole at 4 bare, so it goes too; the probe then ends at 3.
	p.Remove(c[5])
	want = ProbeResult{Hit: 1, Holes: []Hole{{Start: 1, Len: 2}}, BehindHoles: 1}
	if got := p.Probe(c); !reflect.DeepEqual(got, want) {
		t.Fatalf("probe %+v, want %+v", got, want)
	}
	if p.Nodes() != 4 {
		t.Fatalf("Nodes = %d, want 4 (bare holes removed)", p.Nodes())
	}
	// Filling the holes restores the prefix.
	if n, _ := p.Insert(c[:4]); n != 2 {
		t.Fatalf("refill added %d, want 2", n)
	}
	if got := p.Probe(c); got.Hit != 4 || len(got.Holes) != 0 {
		t.Fatalf("after refill %+v", got)
	}
	must(t, p.t.Check())
	// Removing everything leaves an empty tree.
	for _, k := range c {
		p.Remove(k)
	}
	if p.Nodes() != 0 || p.Len() != 0 {
		t.Fatalf("Nodes %d Len %d after removing all", p.Nodes(), p.Len())
	}
	if p.Contains(c[0]) {
		t.Fatal("Contains after removal")
	}
}

func TestPoolIndexSharedPrefixAndConflict(t *testing.T) {
	p := NewPoolIndex(16)
	a := chainOf(1, 2, 3)
	b := chainOf(1, 2, 9)
	p.Insert(a)
	if n, _ := p.Insert(b); n != 1 {
		t.Fatalf("shared prefix added %d, want 1", n)
	}
	p.Remove(a[1])
	if got := p.Probe(b); got.Hit != 1 || got.BehindHoles != 1 {
		t.Fatalf("probe %+v", got)
	}
	// a[2] under a different parent is a broken chain.
	if _, err := p.Insert([]keys.Hash{a[0], a[2]}); err == nil {
		t.Fatal("conflicting chain accepted")
	}
	if got := p.Probe(chainOf(7)); got.Hit != 0 || got.Holes != nil {
		t.Fatalf("unknown chain %+v", got)
	}
}
