package radix

import (
	"encoding/binary"
	"runtime"
	"testing"
	"unsafe"

	"github.com/kvctl/kvctl/core/keys"
)

func TestNodeIsOneCacheLine(t *testing.T) {
	if s := unsafe.Sizeof(node{}); s != 64 {
		t.Fatalf("node is %d bytes, want 64", s)
	}
}

// TestMemoryPerBlock builds a synthetic key-only tree (fan-out 4 at the top, long chains
// below) and checks the heap it takes per block against the 128-byte budget.
func TestMemoryPerBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a 200K-block tree")
	}
	const n = 200_000
	ks := make([]keys.Hash, n)
	for i := range ks {
		binary.LittleEndian.PutUint64(ks[i][:], uint64(i)*0x9e3779b97f4a7c15+1)
		binary.LittleEndian.PutUint64(ks[i][8:], uint64(i))
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	tr := mustTree(t, Config{TokensPerBlock: 512})
	cur := Root
	for i, k := range ks {
		if i%50 == 0 {
			cur = NodeID(0)
		}
		id, _, err := tr.Insert(cur, Block{Key: k, NumTokens: 512})
		if err != nil {
			t.Fatal(err)
		}
		cur = id
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	per := float64(ms.HeapAlloc-before) / float64(tr.Len())
	runtime.KeepAlive(tr)
	t.Logf("%.1f bytes per block", per)
	if per > 128 {
		t.Fatalf("%.1f bytes per block, budget 128", per)
	}
}
