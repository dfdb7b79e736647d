package keys

import (
	"math/rand/v2"
	"testing"
)

// TestPageKeyPrefix: a prefix followed by the hash's hex is exactly PageKey's or
// ReplicatedPageKey's key, for every namespace shape (default and named, attention DP or not,
// several ranks), group, block size and page size.
func TestPageKeyPrefix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	spaces := []Namespace{
		{ModelKey: "m", WorldSize: 1},
		{Namespace: "prod", ModelKey: "llama-3-70b/fp8", WorldSize: 8, Rank: 5},
		{Namespace: "x", ModelKey: "m", WorldSize: 4, Rank: 3, AttentionDP: true},
	}
	for _, n := range spaces {
		for _, group := range []int{0, 1, 17} {
			for _, T := range []int{16, 32, 128} {
				for _, bpp := range []uint64{4096, 65536, 1 << 20, 123457} {
					p, rp := n.PageKeyPrefix(group, T, bpp), n.ReplicatedPageKeyPrefix(group, T, bpp)
					for range 4 {
						var h Hash
						for i := range h {
							h[i] = byte(rng.Uint32())
						}
						if got, want := string(AppendHex([]byte(p), h)), n.PageKey(group, T, bpp, h); got != want {
							t.Fatalf("%+v group %d T %d bytes %d: prefix gives %q, PageKey %q", n, group, T, bpp, got, want)
						}
						if got, want := string(AppendHex([]byte(rp), h)), n.ReplicatedPageKey(group, T, bpp, h); got != want {
							t.Fatalf("%+v group %d T %d bytes %d: replicated prefix gives %q, ReplicatedPageKey %q", n, group, T, bpp, got, want)
						}
					}
				}
			}
		}
	}
}
