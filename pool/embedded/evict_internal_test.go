package embedded

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestCandStreamOrder checks that the partial ordering of the eviction census yields exactly
// the fully sorted order, whatever k the first selection used.
func TestCandStreamOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		leases := rapid.SliceOfN(rapid.Int64Range(0, 20), 0, 200).Draw(t, "leases")
		c := make([]cand, len(leases))
		for i, l := range leases {
			c[i] = cand{lease: l, seq: uint64(i), o: &object{seq: uint64(i)}}
		}
		want := slices.Clone(c)
		slices.SortFunc(want, candCmp)
		k := rapid.IntRange(0, len(c)+1).Draw(t, "k")
		s := newCandStream(c, k)
		for i := range want {
			o := s.next()
			if o == nil || o.seq != want[i].seq {
				t.Fatalf("position %d: got %v, want seq %d", i, o, want[i].seq)
			}
		}
		if s.next() != nil || s.left() != 0 {
			t.Fatal("stream yields more than its candidates")
		}
	})
}
