package embedded_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
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
	if c := p.BatchPut(bg, []string{"a", "b"}, [][]byte{a, b}, pool.ReplicateConfig{}); c[0] != pool.OK || c[1] != pool.OK {
		t.Fatalf("put: %v", c)
	}
	v := p.BatchView(bg, []string{"a", "missing", "b", ""})
	defer v.Release()
	want := []int64{int64(len(a)), int64(pool.ErrObjectNotFound), int64(len(b)), int64(pool.ErrInvalidParams)}
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
	mustPut(t, p, "bad", 4096, pool.ReplicateConfig{})
	mustPut(t, p, "good", 4096, pool.ReplicateConfig{})
	p.CorruptForTest("bad")
	v := p.BatchView(bg, []string{"bad", "good"})
	defer v.Release()
	if v.Codes[0] != int64(pool.ErrChecksumMismatch) || v.Bufs[0] != nil {
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
	if c := p.BatchPut(bg, []string{"all"}, [][]byte{orig}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put: %v", c)
	}
	v := p.BatchView(bg, []string{"all"})
	if c := p.Remove(bg, "all", true); c != pool.OK {
		t.Fatalf("force remove: %v", c)
	}
	if c := p.BatchPut(bg, []string{"other"}, [][]byte{pattern(full, 3)}, pool.ReplicateConfig{}); c[0] != pool.ErrNoAvailableHandle {
		t.Fatalf("put into viewed memory = %v, want %v", c[0], pool.ErrNoAvailableHandle)
	}
	if !bytes.Equal(v.Bufs[0], orig) {
		t.Fatal("viewed bytes changed while the view was held")
	}
	v.Release()
	v.Release() // a second release is harmless
	if c := p.BatchPut(bg, []string{"other"}, [][]byte{pattern(full, 3)}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put after release = %v", c[0])
	}
}

// TestBatchViewCancelledContext fails every key without leasing anything.
func TestBatchViewCancelledContext(t *testing.T) {
	p, _ := newPool(t, nil)
	mustPut(t, p, "a", 4096, pool.ReplicateConfig{})
	ctx, cancel := context.WithCancel(bg)
	cancel()
	v := p.BatchView(ctx, []string{"a"})
	defer v.Release()
	if v.Codes[0] != int64(pool.ErrRPCFail) || v.Bufs[0] != nil {
		t.Fatalf("code %d", v.Codes[0])
	}
}

func TestMemoryRegionsAreTheSegments(t *testing.T) {
	p, _ := newPool(t, nil)
	rs := p.MemoryRegions()
	if len(rs) != 1 || len(rs[0]) != 64*unit {
		t.Fatalf("regions %d, first %d bytes", len(rs), len(rs[0]))
	}
	mustPut(t, p, "a", 4096, pool.ReplicateConfig{})
	v := p.BatchView(bg, []string{"a"})
	defer v.Release()
	base := &rs[0][0]
	if &v.Bufs[0][0] != base {
		t.Fatal("the first value of an empty pool is not at the start of its segment")
	}
}

// TestBatchPutStartEnd writes values into reserved pool memory: they are unreadable until End,
// then read back and verify as if put with BatchPut; an existing key gets no memory; a revoked
// reservation leaves nothing behind and frees its memory.
func TestBatchPutStartEnd(t *testing.T) {
	p, _ := newPool(t, nil)
	mustPut(t, p, "old", 4096, pool.ReplicateConfig{})
	r := p.BatchPutStart(bg, []string{"new", "old", ""}, []int64{3 * unit, 4096, 10}, pool.ReplicateConfig{})
	if r.Codes[0] != pool.OK || r.Bufs[0] == nil || len(r.Bufs[0]) != 3*unit {
		t.Fatalf("new key: code %v, %d bytes of memory", r.Codes[0], len(r.Bufs[0]))
	}
	if r.Codes[1] != pool.OK || r.Bufs[1] != nil {
		t.Fatalf("existing key: code %v, memory %v", r.Codes[1], r.Bufs[1] != nil)
	}
	if r.Codes[2] != pool.ErrInvalidParams || r.Bufs[2] != nil {
		t.Fatalf("empty key: code %v", r.Codes[2])
	}
	want := pattern(3*unit, 4)
	copy(r.Bufs[0], want)
	if got := p.BatchGet(bg, []string{"new"}, [][]byte{make([]byte, 3*unit)}); got[0] != int64(pool.ErrReplicaNotReady) {
		t.Fatalf("get before End = %d, want %d", got[0], pool.ErrReplicaNotReady)
	}
	codes := r.End()
	if codes[0] != pool.OK || codes[1] != pool.OK || codes[2] != pool.ErrInvalidParams {
		t.Fatalf("End codes %v", codes)
	}
	if again := r.Revoke(); again[0] != pool.OK {
		t.Fatal("Revoke after End changed the outcome")
	}
	got := make([]byte, 3*unit)
	if n := p.BatchGet(bg, []string{"new"}, [][]byte{got}); n[0] != 3*unit || !bytes.Equal(got, want) {
		t.Fatalf("get after End = %d", n[0])
	}
	// A byte changed after End is caught like any corruption: the checksum is of what was
	// written before End.
	p.CorruptForTest("new")
	if n := p.BatchGet(bg, []string{"new"}, [][]byte{got}); n[0] != int64(pool.ErrChecksumMismatch) {
		t.Fatalf("get of a value changed after End = %d", n[0])
	}

	before, _ := p.Stats(bg)
	rv := p.BatchPutStart(bg, []string{"gone"}, []int64{8 * unit}, pool.ReplicateConfig{})
	if rv.Bufs[0] == nil {
		t.Fatal("no memory reserved")
	}
	if c := rv.Revoke(); c[0] != pool.ErrRPCFail {
		t.Fatalf("revoked key code %v", c[0])
	}
	after, _ := p.Stats(bg)
	if after.UsedBytes != before.UsedBytes || after.Objects+after.Detail[embedded.DetailPendingObjects] != before.Objects+before.Detail[embedded.DetailPendingObjects] {
		t.Fatalf("revoke left %d bytes / %d objects behind", after.UsedBytes-before.UsedBytes, after.Objects+after.Detail[embedded.DetailPendingObjects]-before.Objects-before.Detail[embedded.DetailPendingObjects])
	}
	if n := p.BatchIsExist(bg, []string{"gone"}); n[0] != 0 {
		t.Fatal("a revoked key exists")
	}
	if bad := p.BatchPutStart(bg, []string{"a", "b"}, []int64{1}, pool.ReplicateConfig{}); bad.Codes[0] != pool.ErrInvalidParams || bad.Codes[1] != pool.ErrInvalidParams {
		t.Fatalf("mismatched sizes: %v", bad.Codes)
	}
}

// TestBatchViewDeferred: a deferred view offers the stored bytes unchecked, with the checksum
// taken at put; a corrupted value is offered too, and its stored checksum no longer matches its
// bytes, which is what the caller's check finds. Corrupt turns the hit into a checksum error,
// once, and calls the hooks.
func TestBatchViewDeferred(t *testing.T) {
	p, _ := newPool(t, nil)
	a := pattern(3*unit, 1)
	if c := p.BatchPut(bg, []string{"a"}, [][]byte{a}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put: %v", c)
	}
	mustPut(t, p, "bad", 4096, pool.ReplicateConfig{})
	p.CorruptForTest("bad")
	v := p.BatchViewDeferred(bg, []string{"a", "missing", "bad"})
	if v.Codes[0] != int64(len(a)) || v.Codes[1] != int64(pool.ErrObjectNotFound) || v.Codes[2] != 4096 {
		t.Fatalf("codes %v", v.Codes)
	}
	if !bytes.Equal(v.Bufs[0], a) || v.Bufs[1] != nil || len(v.Bufs[2]) != 4096 {
		t.Fatal("deferred view bytes differ from what was put")
	}
	if v.Sums[0] != uint64(keys.PageChecksum(a)) {
		t.Fatalf("sum %#x, want the checksum of the value %#x", v.Sums[0], uint64(keys.PageChecksum(a)))
	}
	if v.Sums[2] == uint64(keys.PageChecksum(v.Bufs[2])) {
		t.Fatal("corrupted value's stored checksum matches its bytes")
	}
	st, _ := p.Stats(bg)
	if st.Hits != 2 || st.ChecksumErrors != 0 {
		t.Fatalf("before Corrupt: hits %d checksum errors %d", st.Hits, st.ChecksumErrors)
	}
	hooked := 0
	v.OnCorrupt(func() { hooked++ })
	v.Release()
	v.Corrupt(2)
	v.Corrupt(2)
	v.Corrupt(1) // a miss: nothing to record
	st, _ = p.Stats(bg)
	if st.Hits != 1 || st.ChecksumErrors != 1 || st.BytesOut != int64(len(a)) || hooked != 1 {
		t.Fatalf("after Corrupt: hits %d checksum errors %d bytes out %d hooks %d", st.Hits, st.ChecksumErrors, st.BytesOut, hooked)
	}
	if v.Codes[2] != int64(pool.ErrChecksumMismatch) {
		t.Fatalf("corrupted value's code %d", v.Codes[2])
	}
}

// TestBatchViewDeferredInto: a deferred view filled from keys given as bytes, into a View the
// caller reuses, is the view BatchViewDeferred gives (codes, bytes, checksums, counters); the
// key bytes are not kept (overwriting them after the call changes nothing); a reused view holds
// nothing of its previous call (shorter and longer calls, misses where hits were, no hook of
// the previous call) and is filled in the same arrays; its references keep removed values'
// memory until Release; a cancelled call fails every key.
func TestBatchViewDeferredInto(t *testing.T) {
	p, _ := newPool(t, nil)
	a, b := pattern(3*unit, 1), pattern(unit+17, 2)
	if c := p.BatchPut(bg, []string{"a", "b"}, [][]byte{a, b}, pool.ReplicateConfig{}); c[0] != pool.OK || c[1] != pool.OK {
		t.Fatalf("put: %v", c)
	}
	mustPut(t, p, "bad", 4096, pool.ReplicateConfig{})
	p.CorruptForTest("bad")
	keyBytes := func(ks ...string) [][]byte {
		out := make([][]byte, len(ks))
		for i, k := range ks {
			out[i] = []byte(k)
		}
		return out
	}
	ks := keyBytes("a", "missing", "bad", "")
	want := p.BatchViewDeferred(bg, []string{"a", "missing", "bad", ""})
	want.Release()
	var v pool.View
	p.BatchViewDeferredInto(bg, ks, &v)
	for _, k := range ks {
		for i := range k {
			k[i] = 'x'
		}
	}
	for i := range want.Codes {
		if v.Codes[i] != want.Codes[i] || v.Sums[i] != want.Sums[i] {
			t.Fatalf("key %d: code %d sum %#x, BatchViewDeferred gives %d %#x", i, v.Codes[i], v.Sums[i], want.Codes[i], want.Sums[i])
		}
	}
	if !bytes.Equal(v.Bufs[0], a) || v.Bufs[1] != nil || len(v.Bufs[2]) != 4096 || v.Bufs[3] != nil {
		t.Fatal("the view's bytes differ from what was put")
	}
	hooked := 0
	v.OnCorrupt(func() { hooked++ })
	v.Corrupt(2)
	v.Release()
	st, _ := p.Stats(bg)
	// a and bad of both calls are hits, less the one found corrupt; missing misses twice.
	if st.Hits != 3 || st.ChecksumErrors != 1 || st.Misses != 2 || hooked != 1 {
		t.Fatalf("hits %d checksum errors %d misses %d hooks %d; want 3, 1, 2, 1", st.Hits, st.ChecksumErrors, st.Misses, hooked)
	}

	codes := &v.Codes[0]
	p.BatchViewDeferredInto(bg, keyBytes("b"), &v)
	if len(v.Codes) != 1 || len(v.Bufs) != 1 || len(v.Sums) != 1 || !bytes.Equal(v.Bufs[0], b) || v.Codes[0] != int64(len(b)) {
		t.Fatalf("a shorter call into the view: codes %v", v.Codes)
	}
	if &v.Codes[0] != codes {
		t.Fatal("the view's lists were not reused")
	}
	v.Corrupt(0) // no hook of the previous call may run
	if hooked != 1 {
		t.Fatal("a reused view kept the previous call's hook")
	}
	v.Release()

	p.BatchViewDeferredInto(bg, keyBytes("missing", "b", "gone", "a", "b"), &v)
	wantCodes := []int64{int64(pool.ErrObjectNotFound), int64(len(b)), int64(pool.ErrObjectNotFound), int64(len(a)), int64(len(b))}
	for i, c := range wantCodes {
		if v.Codes[i] != c {
			t.Fatalf("a longer call into the view: codes %v, want %v", v.Codes, wantCodes)
		}
	}
	if v.Bufs[0] != nil || v.Sums[0] != 0 || v.Bufs[2] != nil || v.Sums[2] != 0 || !bytes.Equal(v.Bufs[3], a) {
		t.Fatal("a reused view offers something for a miss")
	}
	if p.Remove(bg, "a", true) != pool.OK {
		t.Fatal("remove a")
	}
	used, _ := p.Stats(bg)
	v.Release()
	after, _ := p.Stats(bg)
	if after.UsedBytes != used.UsedBytes-int64(len(a)) {
		t.Fatalf("used bytes %d before the release, %d after; the view's reference on a removed value did not hold its memory until Release", used.UsedBytes, after.UsedBytes)
	}

	cancelled, cancel := context.WithCancel(bg)
	cancel()
	p.BatchViewDeferredInto(cancelled, keyBytes("b", "bad"), &v)
	if v.Codes[0] != int64(pool.ErrRPCFail) || v.Codes[1] != int64(pool.ErrRPCFail) || v.Bufs[0] != nil {
		t.Fatalf("a cancelled call: codes %v", v.Codes)
	}
	v.Release()
}

// TestBatchViewDeferredIntoAllocatesNothing: once a reused view's lists are long enough, a call
// into it and its release allocate nothing.
func TestBatchViewDeferredIntoAllocatesNothing(t *testing.T) {
	p, _ := newPool(t, nil)
	var ks [][]byte
	for i := range 16 {
		k := fmt.Sprintf("page-%02d", i)
		mustPut(t, p, k, 64, pool.ReplicateConfig{})
		ks = append(ks, []byte(k))
	}
	var v pool.View
	if n := testing.AllocsPerRun(100, func() {
		p.BatchViewDeferredInto(bg, ks, &v)
		v.Release()
	}); n != 0 {
		t.Fatalf("%v allocations a call", n)
	}
	if v.Codes[15] != 64 {
		t.Fatalf("codes %v", v.Codes)
	}
}
