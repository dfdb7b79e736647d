package pooltest

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvctl/kvctl/pool"
)

// Factory returns a fresh, empty pool; the suite does not close it (use t.Cleanup).
type Factory func(t *testing.T) pool.Pool

// page returns n bytes derived from key, so every key has distinct content.
func page(key string, n int) []byte {
	b := make([]byte, n)
	var h uint32 = 2166136261
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * 16777619
	}
	for i := range b {
		h ^= h << 13
		h ^= h >> 17
		h ^= h << 5
		b[i] = byte(h)
	}
	return b
}

// Suite is the conformance suite every backend runs, after restic's backend test suite: a
// backend's test sets NewPool (and, for its benchmarks, NewBenchPool) and calls RunTests and
// RunBenchmarks. A factory must return an empty pool with room for at least 64 MiB of pages,
// large enough that the suite never triggers eviction.
type Suite struct {
	// NewPool returns a fresh, empty pool for one case.
	NewPool Factory
	// NewBenchPool returns a fresh, empty pool for one benchmark; nil skips the benchmarks.
	NewBenchPool func(b *testing.B) pool.Pool
}

// Run runs every conformance case as a subtest of t (Suite.RunTests with newPool).
func Run(t *testing.T, newPool Factory) { (&Suite{NewPool: newPool}).RunTests(t) }

// cases are the conformance cases, by name.
var cases = []struct {
	name string
	fn   func(t *testing.T, p pool.Pool)
}{
	{"PutGetRoundTrip", testRoundTrip},
	{"ExistReportsPresence", testExist},
	{"PutNeverOverwrites", testNoOverwrite},
	{"DuplicateKeysInOneBatch", testDuplicateInBatch},
	{"GetMissingIsNotFound", testGetMissing},
	{"GetIntoSmallBufferFails", testSmallBuffer},
	{"GetIntoLargerBufferReturnsLength", testLargeBuffer},
	{"CallerOwnsBuffers", testBufferOwnership},
	{"MixedBatch", testMixedBatch},
	{"InvalidParams", testInvalidParams},
	{"SoftPinTTLCeiling", testSoftPinCeiling},
	{"RemoveLeaseRule", testRemove},
	{"SegmentsAndStats", testSegmentsStats},
	{"ConcurrentUse", testConcurrent},
}

// RunTests runs every conformance case as a subtest of t, each on a fresh pool.
func (s *Suite) RunTests(t *testing.T) {
	if s.NewPool == nil {
		t.Fatal("pooltest.Suite: NewPool is nil")
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, s.NewPool(t))
		})
	}
}

// benchSizes are the benchmark page sizes: a 64 KiB page (a small model's block) and 1 MiB.
var benchSizes = []int{64 << 10, 1 << 20}

// benchBatch is the number of pages of one benchmark call, about one request's prefix.
const benchBatch = 16

// RunBenchmarks runs the suite's benchmarks as sub-benchmarks of b: batched puts of new keys
// and batched gets of stored keys at each page size (bytes per second of page data), and
// existence probes of a half-stored batch.
func (s *Suite) RunBenchmarks(b *testing.B) {
	if s.NewBenchPool == nil {
		b.Skip("pooltest.Suite: no NewBenchPool")
	}
	for _, size := range benchSizes {
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run("BatchPut/"+name, func(b *testing.B) { benchPut(b, s.NewBenchPool(b), size) })
		b.Run("BatchGet/"+name, func(b *testing.B) { benchGet(b, s.NewBenchPool(b), size) })
	}
	b.Run("BatchIsExist", func(b *testing.B) { benchExist(b, s.NewBenchPool(b)) })
}

// benchKeys returns n keys of the benchmark named by prefix, numbered from from.
func benchKeys(prefix string, from, n int) []string {
	ks := make([]string, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("bench/%s/%08d", prefix, from+i)
	}
	return ks
}

func benchBufs(size int) [][]byte {
	bufs := make([][]byte, benchBatch)
	for i := range bufs {
		bufs[i] = page(fmt.Sprint(i), size)
	}
	return bufs
}

// benchPut stores new keys, removing each batch once stored (outside the timer) so the pool
// never fills.
func benchPut(b *testing.B, p pool.Pool, size int) {
	bufs := benchBufs(size)
	b.SetBytes(int64(size * benchBatch))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ks := benchKeys("put", i*benchBatch, benchBatch)
		i++
		for j, c := range p.BatchPut(ctx, ks, bufs, pool.ReplicateConfig{}) {
			if c != pool.OK {
				b.Fatalf("BatchPut %s = %v", ks[j], c)
			}
		}
		b.StopTimer()
		for _, k := range ks {
			if c := p.Remove(ctx, k, true); c != pool.OK {
				b.Fatalf("Remove %s = %v", k, c)
			}
		}
		b.StartTimer()
	}
}

// benchGet reads one stored batch over and over.
func benchGet(b *testing.B, p pool.Pool, size int) {
	ks := benchKeys("get", 0, benchBatch)
	put(b, p, ks, benchBufs(size))
	dst := make([][]byte, benchBatch)
	for i := range dst {
		dst[i] = make([]byte, size)
	}
	b.SetBytes(int64(size * benchBatch))
	b.ReportAllocs()
	for b.Loop() {
		for j, n := range p.BatchGet(ctx, ks, dst) {
			if n != int64(size) {
				b.Fatalf("BatchGet %s = %d, want %d", ks[j], n, size)
			}
		}
	}
}

// benchExist probes a batch of which the first half is stored.
func benchExist(b *testing.B, p pool.Pool) {
	stored := benchKeys("exist", 0, benchBatch/2)
	put(b, p, stored, benchBufs(4096)[:len(stored)])
	ks := append(append([]string(nil), stored...), benchKeys("absent", 0, benchBatch/2)...)
	b.ReportAllocs()
	for b.Loop() {
		for j, got := range p.BatchIsExist(ctx, ks) {
			if want := j < len(stored); (got == 1) != want {
				b.Fatalf("BatchIsExist %s = %d", ks[j], got)
			}
		}
	}
}

var ctx = context.Background()

// put stores bufs under keys with the default replication, failing t on any code but OK.
func put(t testing.TB, p pool.Pool, keys []string, bufs [][]byte) {
	t.Helper()
	for i, c := range p.BatchPut(ctx, keys, bufs, pool.ReplicateConfig{}) {
		if c != pool.OK {
			t.Fatalf("BatchPut %q = %v (%d), want OK", keys[i], c, c)
		}
	}
}

func testRoundTrip(t *testing.T, p pool.Pool) {
	sizes := []int{1, 4096, 65536, 1 << 20, 4 << 20}
	var ks []string
	var bufs [][]byte
	for _, n := range sizes {
		k := fmt.Sprintf("rt/%d", n)
		ks = append(ks, k)
		bufs = append(bufs, page(k, n))
	}
	put(t, p, ks, bufs)
	dst := make([][]byte, len(ks))
	for i, n := range sizes {
		dst[i] = make([]byte, n)
	}
	got := p.BatchGet(ctx, ks, dst)
	for i := range ks {
		if got[i] != int64(sizes[i]) {
			t.Fatalf("BatchGet %q = %d, want %d", ks[i], got[i], sizes[i])
		}
		if !bytes.Equal(dst[i], bufs[i]) {
			t.Fatalf("BatchGet %q returned different bytes", ks[i])
		}
	}
}

func testExist(t *testing.T, p pool.Pool) {
	put(t, p, []string{"e/a"}, [][]byte{page("e/a", 100)})
	got := p.BatchIsExist(ctx, []string{"e/a", "e/missing", "e/a"})
	want := []int{1, 0, 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("BatchIsExist = %v, want %v", got, want)
		}
	}
	if got := p.BatchIsExist(ctx, nil); len(got) != 0 {
		t.Fatalf("BatchIsExist(nil) = %v, want empty", got)
	}
}

func testNoOverwrite(t *testing.T, p pool.Pool) {
	first := page("first", 512)
	put(t, p, []string{"ow"}, [][]byte{first})
	put(t, p, []string{"ow"}, [][]byte{page("second", 1024)})
	dst := make([]byte, 2048)
	got := p.BatchGet(ctx, []string{"ow"}, [][]byte{dst})
	if got[0] != 512 || !bytes.Equal(dst[:512], first) {
		t.Fatalf("after a second put, get = %d and the first bytes were not kept", got[0])
	}
}

func testDuplicateInBatch(t *testing.T, p pool.Pool) {
	a, b := page("dupA", 256), page("dupB", 256)
	put(t, p, []string{"dup", "dup"}, [][]byte{a, b})
	dst := make([]byte, 256)
	if got := p.BatchGet(ctx, []string{"dup"}, [][]byte{dst}); got[0] != 256 {
		t.Fatalf("get = %d, want 256", got[0])
	}
	if !bytes.Equal(dst, a) && !bytes.Equal(dst, b) {
		t.Fatal("stored bytes match neither put")
	}
}

func testGetMissing(t *testing.T, p pool.Pool) {
	got := p.BatchGet(ctx, []string{"nope"}, [][]byte{make([]byte, 8)})
	if got[0] != int64(pool.ErrObjectNotFound) {
		t.Fatalf("get of a missing key = %d, want %d", got[0], pool.ErrObjectNotFound)
	}
}

func testSmallBuffer(t *testing.T, p pool.Pool) {
	put(t, p, []string{"small"}, [][]byte{page("small", 1000)})
	got := p.BatchGet(ctx, []string{"small"}, [][]byte{make([]byte, 999)})
	if got[0] != int64(pool.ErrInvalidParams) {
		t.Fatalf("get into a short buffer = %d, want %d", got[0], pool.ErrInvalidParams)
	}
}

func testLargeBuffer(t *testing.T, p pool.Pool) {
	src := page("large", 300)
	put(t, p, []string{"large"}, [][]byte{src})
	dst := bytes.Repeat([]byte{0xAA}, 400)
	got := p.BatchGet(ctx, []string{"large"}, [][]byte{dst})
	if got[0] != 300 || !bytes.Equal(dst[:300], src) {
		t.Fatalf("get into a larger buffer = %d, want 300 and the stored bytes", got[0])
	}
	if dst[300] != 0xAA {
		t.Fatal("get wrote past the object's length")
	}
}

func testBufferOwnership(t *testing.T, p pool.Pool) {
	src := page("own", 4096)
	keep := append([]byte(nil), src...)
	put(t, p, []string{"own"}, [][]byte{src})
	for i := range src {
		src[i] = 0
	}
	dst := make([]byte, 4096)
	p.BatchGet(ctx, []string{"own"}, [][]byte{dst})
	if !bytes.Equal(dst, keep) {
		t.Fatal("changing the put buffer after BatchPut changed the stored page")
	}
	for i := range dst {
		dst[i] = 1
	}
	dst2 := make([]byte, 4096)
	p.BatchGet(ctx, []string{"own"}, [][]byte{dst2})
	if !bytes.Equal(dst2, keep) {
		t.Fatal("changing a get buffer changed the stored page")
	}
}

func testMixedBatch(t *testing.T, p pool.Pool) {
	put(t, p, []string{"m/1", "m/3"}, [][]byte{page("m/1", 64), page("m/3", 64)})
	ks := []string{"m/1", "m/2", "m/3"}
	dst := [][]byte{make([]byte, 64), make([]byte, 64), make([]byte, 64)}
	got := p.BatchGet(ctx, ks, dst)
	if got[0] != 64 || got[1] != int64(pool.ErrObjectNotFound) || got[2] != 64 {
		t.Fatalf("mixed BatchGet = %v", got)
	}
}

func testInvalidParams(t *testing.T, p pool.Pool) {
	res := p.BatchPut(ctx, []string{"a", "b"}, [][]byte{page("a", 8)}, pool.ReplicateConfig{})
	for _, c := range res {
		if c >= 0 {
			t.Fatalf("BatchPut with fewer buffers than keys = %v, want failures", res)
		}
	}
	res = p.BatchPut(ctx, []string{"a", "b"}, [][]byte{page("a", 8), page("b", 8)},
		pool.ReplicateConfig{GroupIDs: []string{"g"}})
	for _, c := range res {
		if c != pool.ErrInvalidParams {
			t.Fatalf("BatchPut with a wrong group_ids length = %v, want INVALID_PARAMS", res)
		}
	}
	res = p.BatchPut(ctx, []string{"a"}, [][]byte{page("a", 8)},
		pool.ReplicateConfig{SoftPinAction: pool.SoftPinPreserve, SoftPinTTL: time.Minute})
	if res[0] != pool.ErrInvalidParams {
		t.Fatalf("soft-pin TTL without ENABLE = %v, want INVALID_PARAMS", res[0])
	}
	if res := p.BatchPut(ctx, []string{""}, [][]byte{page("x", 8)}, pool.ReplicateConfig{}); res[0] >= 0 {
		t.Fatalf("put of an empty key = %v, want a failure", res[0])
	}
	if got := p.BatchIsExist(ctx, []string{"a"}); got[0] != 0 {
		t.Fatalf("a refused put left the key present (%d)", got[0])
	}
}

func testSoftPinCeiling(t *testing.T, p pool.Pool) {
	res := p.BatchPut(ctx, []string{"sp/ok", "sp/ok2"}, [][]byte{page("1", 8), page("2", 8)},
		pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: time.Hour})
	if res[0] != pool.OK || res[1] != pool.OK {
		t.Fatalf("soft pin of 1 h = %v, want OK", res)
	}
	res = p.BatchPut(ctx, []string{"sp/long"}, [][]byte{page("3", 8)},
		pool.ReplicateConfig{SoftPinAction: pool.SoftPinEnable, SoftPinTTL: 25 * time.Hour})
	if res[0] != pool.ErrInvalidParams {
		t.Fatalf("soft pin of 25 h = %v, want INVALID_PARAMS (the master's 24 h ceiling)", res[0])
	}
}

func testRemove(t *testing.T, p pool.Pool) {
	if c := p.Remove(ctx, "rm/none", false); c != pool.ErrObjectNotFound {
		t.Fatalf("Remove of a missing key = %v, want OBJECT_NOT_FOUND", c)
	}
	put(t, p, []string{"rm/a"}, [][]byte{page("rm/a", 128)})
	// A get grants a read lease: a plain Remove must keep the object.
	if got := p.BatchGet(ctx, []string{"rm/a"}, [][]byte{make([]byte, 128)}); got[0] != 128 {
		t.Fatalf("get = %d", got[0])
	}
	if c := p.Remove(ctx, "rm/a", false); c != pool.ErrObjectHasLease {
		t.Fatalf("Remove of a leased object = %v, want OBJECT_HAS_LEASE", c)
	}
	if got := p.BatchIsExist(ctx, []string{"rm/a"}); got[0] != 1 {
		t.Fatal("a refused Remove deleted the object")
	}
	if c := p.Remove(ctx, "rm/a", true); c != pool.OK {
		t.Fatalf("forced Remove = %v, want OK", c)
	}
	if got := p.BatchIsExist(ctx, []string{"rm/a"}); got[0] != 0 {
		t.Fatal("object still present after a forced Remove")
	}
	put(t, p, []string{"rm/a"}, [][]byte{page("again", 64)})
	dst := make([]byte, 64)
	if got := p.BatchGet(ctx, []string{"rm/a"}, [][]byte{dst}); got[0] != 64 || !bytes.Equal(dst, page("again", 64)) {
		t.Fatal("a put after Remove did not store the new bytes")
	}
}

func testSegmentsStats(t *testing.T, p pool.Pool) {
	segs, err := p.Segments(ctx)
	if err != nil || len(segs) == 0 {
		t.Fatalf("Segments = %v, %v; want at least one", segs, err)
	}
	before, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put(t, p, []string{"st/a"}, [][]byte{page("st/a", 1000)})
	put(t, p, []string{"st/a"}, [][]byte{page("st/a", 1000)})
	p.BatchGet(ctx, []string{"st/a", "st/none"}, [][]byte{make([]byte, 1000), make([]byte, 1)})
	after, err := p.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want int64
	}{
		{"objects", after.Objects - before.Objects, 1},
		{"puts", after.Puts - before.Puts, 1},
		{"skipped_existing", after.SkippedExisting - before.SkippedExisting, 1},
		{"hits", after.Hits - before.Hits, 1},
		{"misses", after.Misses - before.Misses, 1},
		{"bytes_in", after.BytesIn - before.BytesIn, 1000},
		{"bytes_out", after.BytesOut - before.BytesOut, 1000},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("stats %s grew by %d, want %d", c.name, c.got, c.want)
		}
	}
	if after.UsedBytes < 1000 || after.CapacityBytes < after.UsedBytes {
		t.Errorf("used %d / capacity %d after storing 1000 bytes", after.UsedBytes, after.CapacityBytes)
	}
	var segUsed int64
	segs, _ = p.Segments(ctx)
	for _, s := range segs {
		segUsed += s.Used
	}
	if segUsed != after.UsedBytes {
		t.Errorf("segments use %d bytes, stats say %d", segUsed, after.UsedBytes)
	}
}

func testConcurrent(t *testing.T, p pool.Pool) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				k := fmt.Sprintf("cc/%d", i%20) // goroutines share keys on purpose
				src := page(k, 2048)
				if c := p.BatchPut(ctx, []string{k}, [][]byte{src}, pool.ReplicateConfig{}); c[0] != pool.OK {
					errs <- fmt.Errorf("put %s = %v", k, c[0])
					return
				}
				dst := make([]byte, 2048)
				n := p.BatchGet(ctx, []string{k}, [][]byte{dst})[0]
				if n == int64(pool.ErrReplicaNotReady) {
					continue // another goroutine's put of the same key is still copying
				}
				if n != 2048 || !bytes.Equal(dst, src) {
					errs <- fmt.Errorf("get %s = %d, bytes equal %v", k, n, bytes.Equal(dst, src))
					return
				}
				p.BatchIsExist(ctx, []string{k, "cc/none"})
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
