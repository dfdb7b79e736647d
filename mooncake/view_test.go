package mooncake_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvctl/kvctl/mooncake"
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13+i>>8)
	}
	return b
}

// TestBatchViewReturnsVerifiedPoolMemory checks that a view holds the stored bytes, that misses
// and bad keys get the codes BatchGet gives them, and that the view counts as a get.
func TestBatchViewReturnsVerifiedPoolMemory(t *testing.T) {
	p, _ := newPool(t, nil)
	a, b := pattern(3*unit, 1), pattern(unit+17, 2)
	if c := p.BatchPut(bg, []string{"a", "b"}, [][]byte{a, b}, mooncake.ReplicateConfig{}); c[0] != mooncake.OK || c[1] != mooncake.OK {
		t.Fatalf("put: %v", c)
	}
	v := p.BatchView(bg, []string{"a", "missing", "b", ""})
	defer v.Release()
	want := []int64{int64(len(a)), int64(mooncake.ErrObjectNotFound), int64(len(b)), int64(mooncake.ErrInvalidParams)}
	for i, c := range v.Codes {
		if c != want[i] {
			t.Fatalf("codes %v, want %v", v.Codes, want)
		}
	}
	if !bytes.Equal(v.Bufs[0], a) || !bytes.Equal(v.Bufs[2], b) || v.Bufs[1] != nil || v.Bufs[3] != nil {
		t.Fatal("view bytes differ from what was put")
	}
	if cap(v.Bufs[0]) != len(a) {
		t.Fatalf("view capacity %d reaches past the value (%d)", cap(v.Bufs[0]), len(a))
	}
	st, _ := p.Stats(bg)
	if st.Hits != 2 || st.Misses != 1 || st.BytesOut != int64(len(a)+len(b)) {
		t.Fatalf("hits %d misses %d bytes out %d", st.Hits, st.Misses, st.BytesOut)
	}
}

// TestBatchViewRefusesCorruptedPages: a corrupted value is never offered; the others of the
// batch are.
func TestBatchViewRefusesCorruptedPages(t *testing.T) {
	p, _ := newPool(t, nil)
	mustPut(t, p, "bad", 4096, mooncake.ReplicateConfig{})
	mustPut(t, p, "good", 4096, mooncake.ReplicateConfig{})
	p.CorruptForTest("bad")
	v := p.BatchView(bg, []string{"bad", "good"})
	defer v.Release()
	if v.Codes[0] != int64(mooncake.ErrChecksumMismatch) || v.Bufs[0] != nil {
		t.Fatalf("corrupted page: code %d, buffer offered %v", v.Codes[0], v.Bufs[0] != nil)
	}
	if v.Codes[1] != 4096 || v.Bufs[1] == nil {
		t.Fatalf("good page: code %d", v.Codes[1])
	}
	st, _ := p.Stats(bg)
	if st.ChecksumErrors != 1 {
		t.Fatalf("checksum errors %d, want 1", st.ChecksumErrors)
	}
}

// TestBatchViewHoldsMemoryUntilRelease: a value force-removed while viewed keeps its memory
// (a new put cannot take it) until the view is released.
func TestBatchViewHoldsMemoryUntilRelease(t *testing.T) {
	p, _ := newPool(t, nil)
	full := 64 * unit
	orig := pattern(full, 9)
	if c := p.BatchPut(bg, []string{"all"}, [][]byte{orig}, mooncake.ReplicateConfig{}); c[0] != mooncake.OK {
		t.Fatalf("put: %v", c)
	}
	v := p.BatchView(bg, []string{"all"})
	if c := p.Remove(bg, "all", true); c != mooncake.OK {
		t.Fatalf("force remove: %v", c)
	}
	if c := p.BatchPut(bg, []string{"other"}, [][]byte{pattern(full, 3)}, mooncake.ReplicateConfig{}); c[0] != mooncake.ErrNoAvailableHandle {
		t.Fatalf("put into viewed memory = %v, want %v", c[0], mooncake.ErrNoAvailableHandle)
	}
	if !bytes.Equal(v.Bufs[0], orig) {
		t.Fatal("viewed bytes changed while the view was held")
	}
	v.Release()
	v.Release() // a second release is harmless
	if c := p.BatchPut(bg, []string{"other"}, [][]byte{pattern(full, 3)}, mooncake.ReplicateConfig{}); c[0] != mooncake.OK {
		t.Fatalf("put after release = %v", c[0])
	}
}

// TestBatchViewCancelledContext fails every key without leasing anything.
func TestBatchViewCancelledContext(t *testing.T) {
	p, _ := newPool(t, nil)
	mustPut(t, p, "a", 4096, mooncake.ReplicateConfig{})
	ctx, cancel := context.WithCancel(bg)
	cancel()
	v := p.BatchView(ctx, []string{"a"})
	defer v.Release()
	if v.Codes[0] != int64(mooncake.ErrRPCFail) || v.Bufs[0] != nil {
		t.Fatalf("code %d", v.Codes[0])
	}
}

func TestMemoryRegionsAreTheSegments(t *testing.T) {
	p, _ := newPool(t, nil)
	rs := p.MemoryRegions()
	if len(rs) != 1 || len(rs[0]) != 64*unit {
		t.Fatalf("regions %d, first %d bytes", len(rs), len(rs[0]))
	}
	mustPut(t, p, "a", 4096, mooncake.ReplicateConfig{})
	v := p.BatchView(bg, []string{"a"})
	defer v.Release()
	base := &rs[0][0]
	if &v.Bufs[0][0] != base {
		t.Fatal("the first value of an empty pool is not at the start of its segment")
	}
}
