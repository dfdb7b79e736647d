package embedded

import (
	"context"
	"testing"

	"github.com/kvctl/kvctl/pool"
)

// TestGetAndViewCatchCorruptionAnywhere flips one byte at several places of a 1 MiB value (every
// 64 KiB piece of the fused copy-and-check, and its edges): BatchGet and BatchView must both
// refuse it, and accept it again once the byte is restored.
func TestGetAndViewCatchCorruptionAnywhere(t *testing.T) {
	o := DefaultOptions()
	o.Segments = []SegmentSpec{{Name: "s", Capacity: 4 << 20}}
	o.EvictionPeriod = 0
	p, err := NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	val := make([]byte, 1<<20)
	for i := range val {
		val[i] = byte(i*31 + i>>10)
	}
	ctx := context.Background()
	if c := p.BatchPut(ctx, []string{"k"}, [][]byte{val}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatal(c)
	}
	obj := p.objs["k"]
	mem := obj.seg.mem[obj.off : obj.off+obj.size]
	dst := make([]byte, len(val))
	for _, at := range []int{0, 1, 65535, 65536, 65537, 300000, 1<<20 - 65536, 1<<20 - 1} {
		mem[at] ^= 0x10
		if got := p.BatchGet(ctx, []string{"k"}, [][]byte{dst}); got[0] != int64(pool.ErrChecksumMismatch) {
			t.Fatalf("get with byte %d flipped = %d", at, got[0])
		}
		v := p.BatchView(ctx, []string{"k"})
		if v.Codes[0] != int64(pool.ErrChecksumMismatch) || v.Bufs[0] != nil {
			t.Fatalf("view with byte %d flipped = %d", at, v.Codes[0])
		}
		v.Release()
		mem[at] ^= 0x10
		if got := p.BatchGet(ctx, []string{"k"}, [][]byte{dst}); got[0] != int64(len(val)) {
			t.Fatalf("get after restoring byte %d = %d", at, got[0])
		}
	}
}
