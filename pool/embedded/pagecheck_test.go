package embedded_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// checkSizes are page sizes on both sides of the checksum's 64 KiB pieces and 1 KiB blocks.
var checkSizes = []int{4 << 10, 64 << 10, 64<<10 + 1, 200<<10 + 17, 1 << 20, 4<<20 + 3}

func randomPage(r *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

func bigPool(t *testing.T, capacity int64, mod func(*embedded.Options)) *embedded.Embedded {
	t.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "big", Capacity: capacity}}
	o.EvictionPeriod = 0
	if mod != nil {
		mod(&o)
	}
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// flip XORs one byte of key's value where it lies in pool memory (found through a deferred
// view, which checks nothing).
func flip(t *testing.T, p *embedded.Embedded, key string, off int) {
	t.Helper()
	v := p.BatchViewDeferred(bg, []string{key})
	defer v.Release()
	if v.Codes[0] < 0 {
		t.Fatalf("view of %s = %d", key, v.Codes[0])
	}
	v.Bufs[0][off] ^= 0x5a
}

// TestCorruptedLargePagesRefused corrupts one byte of stored pages of every size at the start, in
// the middle, at the last block and piece boundaries and at the end: each get is refused with
// ErrChecksumMismatch and counted, and once the byte is restored the page is returned intact.
func TestCorruptedLargePagesRefused(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	p := bigPool(t, 16<<20, nil)
	for _, n := range checkSizes {
		key := fmt.Sprintf("page/%d", n)
		page := randomPage(r, n)
		if c := p.BatchPut(bg, []string{key}, [][]byte{page}, pool.ReplicateConfig{}); c[0] != pool.OK {
			t.Fatalf("put %s = %v", key, c[0])
		}
		offs := []int{0, n / 2, n - 1, n - 64, n - 65}
		if n > 64<<10 {
			offs = append(offs, 64<<10-1, 64<<10, (n-1)/1024*1024-1, (n-1)/1024*1024)
		}
		dst := make([]byte, n)
		for _, off := range offs {
			before, _ := p.Stats(bg)
			flip(t, p, key, off)
			if got := p.BatchGet(bg, []string{key}, [][]byte{dst}); got[0] != int64(pool.ErrChecksumMismatch) {
				t.Fatalf("%d-byte page corrupted at %d: get = %d, want ErrChecksumMismatch", n, off, got[0])
			}
			v := p.BatchView(bg, []string{key})
			if v.Codes[0] != int64(pool.ErrChecksumMismatch) || v.Bufs[0] != nil {
				t.Fatalf("%d-byte page corrupted at %d: view = %d", n, off, v.Codes[0])
			}
			v.Release()
			after, _ := p.Stats(bg)
			if after.ChecksumErrors != before.ChecksumErrors+2 {
				t.Fatalf("checksum errors %d -> %d, want two more", before.ChecksumErrors, after.ChecksumErrors)
			}
			flip(t, p, key, off)
			if got := p.BatchGet(bg, []string{key}, [][]byte{dst}); got[0] != int64(n) || !bytes.Equal(dst, page) {
				t.Fatalf("%d-byte page restored at %d: get = %d, bytes equal %v", n, off, got[0], bytes.Equal(dst, page))
			}
		}
	}
}

// TestConcurrentPutGetWithCorruptPage runs callers that each put and get their own batches of
// large pages (spread over the CPUs inside each call) while all of them keep reading one
// corrupted page: every good page comes back byte for byte, the corrupted one is refused every
// time. Run it with -race.
func TestConcurrentPutGetWithCorruptPage(t *testing.T) {
	const callers, rounds = 4, 3
	sizes := []int{64 << 10, 64<<10 + 1, 300<<10 + 5, 1 << 20}
	var batch int
	for _, n := range sizes {
		batch += n
	}
	p := bigPool(t, int64(callers*rounds*batch+(1<<20)), nil)
	r := rand.New(rand.NewPCG(23, 24))
	bad := randomPage(r, 1<<20)
	if c := p.BatchPut(bg, []string{"bad"}, [][]byte{bad}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put bad = %v", c[0])
	}
	flip(t, p, "bad", 700<<10)
	pages := make([][]byte, len(sizes))
	for i, n := range sizes {
		pages[i] = randomPage(r, n)
	}
	var wg sync.WaitGroup
	errs := make(chan error, callers*rounds)
	for c := range callers {
		wg.Go(func() {
			for round := range rounds {
				ks := make([]string, len(sizes))
				for i := range ks {
					ks[i] = fmt.Sprintf("c%d/r%d/%d", c, round, i)
				}
				for i, code := range p.BatchPut(bg, ks, pages, pool.ReplicateConfig{}) {
					if code != pool.OK {
						errs <- fmt.Errorf("put %s = %v", ks[i], code)
						return
					}
				}
				dst := make([][]byte, len(sizes)+1)
				for i, n := range sizes {
					dst[i] = make([]byte, n)
				}
				dst[len(sizes)] = make([]byte, len(bad))
				got := p.BatchGet(bg, append(ks, "bad"), dst)
				for i := range sizes {
					if got[i] != int64(sizes[i]) || !bytes.Equal(dst[i], pages[i]) {
						errs <- fmt.Errorf("get %s = %d, bytes equal %v", ks[i], got[i], bytes.Equal(dst[i], pages[i]))
						return
					}
				}
				if got[len(sizes)] != int64(pool.ErrChecksumMismatch) {
					errs <- fmt.Errorf("get of the corrupted page = %d, want ErrChecksumMismatch", got[len(sizes)])
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st, _ := p.Stats(bg)
	if st.ChecksumErrors != callers*rounds {
		t.Fatalf("checksum errors %d, want %d", st.ChecksumErrors, callers*rounds)
	}
}

// resident counts the pages of mem the kernel holds in memory.
func resident(t *testing.T, mem []byte) (in, total int) {
	t.Helper()
	vec := make([]byte, (len(mem)+unix.Getpagesize()-1)/unix.Getpagesize())
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	for _, v := range vec {
		if v&1 != 0 {
			in++
		}
	}
	return in, len(vec)
}

// TestPrefaultMakesSegmentsResident checks Options.Prefault: with it every page of every segment
// is resident as soon as the pool is made, without it none is until written, and a prefaulted
// pool stores, checks and refuses pages as any other.
func TestPrefaultMakesSegmentsResident(t *testing.T) {
	const segBytes = 6<<20 + 4096 // not a whole number of huge pages
	mk := func(pre bool) *embedded.Embedded {
		o := embedded.DefaultOptions()
		o.Segments = []embedded.SegmentSpec{{Name: "a", Capacity: segBytes}, {Name: "b", Capacity: segBytes}}
		o.EvictionPeriod = 0
		o.Prefault = pre
		p, err := embedded.NewEmbedded(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	cold := mk(false)
	for i, m := range cold.MemoryRegions() {
		if in, _ := resident(t, m); in != 0 {
			t.Fatalf("segment %d without Prefault: %d pages resident before any put", i, in)
		}
	}
	warm := mk(true)
	for i, m := range warm.MemoryRegions() {
		if in, total := resident(t, m); in != total {
			t.Fatalf("segment %d with Prefault: %d of %d pages resident", i, in, total)
		}
	}
	page := randomPage(rand.New(rand.NewPCG(25, 26)), 1<<20)
	if c := warm.BatchPut(bg, []string{"k"}, [][]byte{page}, pool.ReplicateConfig{}); c[0] != pool.OK {
		t.Fatalf("put = %v", c[0])
	}
	dst := make([]byte, len(page))
	if got := warm.BatchGet(bg, []string{"k"}, [][]byte{dst}); got[0] != int64(len(page)) || !bytes.Equal(dst, page) {
		t.Fatalf("get = %d", got[0])
	}
	if !warm.CorruptForTest("k") {
		t.Fatal("corrupt hook found no object")
	}
	if got := warm.BatchGet(bg, []string{"k"}, [][]byte{dst}); got[0] != int64(pool.ErrChecksumMismatch) {
		t.Fatalf("get of a corrupted page = %d", got[0])
	}
}

// TestLargePagesUnderEviction runs writers, readers (copying and in place) and removers over
// pages longer than the checksum's 64 KiB pieces in a pool far too small for them, with the
// eviction goroutine running: every page handed out is byte for byte what was put, no check
// fails on an intact page, and all memory comes back. Run it with -race.
func TestLargePagesUnderEviction(t *testing.T) {
	o := func(mo *embedded.Options) {
		mo.Segments = []embedded.SegmentSpec{{Name: "s0", Capacity: 3 << 20}, {Name: "s1", Capacity: 3 << 20}}
		mo.EvictionPeriod = time.Millisecond
		mo.LeaseTTL = 2 * time.Millisecond
	}
	p := bigPool(t, 6<<20, o)
	sizes := []int{64<<10 + 1, 200<<10 + 17, 513 << 10}
	r := rand.New(rand.NewPCG(27, 28))
	const nKeys = 48
	names := make([]string, nKeys)
	pages := make(map[string][]byte, nKeys)
	for i := range names {
		names[i] = fmt.Sprintf("large/%02d", i)
		pages[names[i]] = randomPage(r, sizes[i%len(sizes)])
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	var hits int
	report := func(format string, a ...any) {
		mu.Lock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, a...))
		}
		mu.Unlock()
	}
	for w := range 6 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 29))
			for range 150 {
				batch := make([]string, 1+r.IntN(4))
				for j := range batch {
					batch[j] = names[r.IntN(nKeys)]
				}
				switch r.IntN(6) {
				case 0, 1:
					bufs := make([][]byte, len(batch))
					for j, k := range batch {
						bufs[j] = pages[k]
					}
					for j, c := range p.BatchPut(bg, batch, bufs, pool.ReplicateConfig{}) {
						if c != pool.OK && c != pool.ErrNoAvailableHandle {
							report("put %s = %v", batch[j], c)
						}
					}
				case 2, 3:
					bufs := make([][]byte, len(batch))
					for j := range bufs {
						bufs[j] = make([]byte, 513<<10)
					}
					for j, n := range p.BatchGet(bg, batch, bufs) {
						switch {
						case n >= 0:
							if !bytes.Equal(bufs[j][:n], pages[batch[j]]) {
								report("get %s returned %d bytes that differ from the put", batch[j], n)
							}
							mu.Lock()
							hits++
							mu.Unlock()
						case n == int64(pool.ErrObjectNotFound), n == int64(pool.ErrReplicaNotReady):
						default:
							report("get %s = %d", batch[j], n)
						}
					}
				case 4:
					v := p.BatchView(bg, batch)
					for j, n := range v.Codes {
						if n >= 0 && !bytes.Equal(v.Bufs[j], pages[batch[j]]) {
							report("view %s differs from the put", batch[j])
						}
						if n == int64(pool.ErrChecksumMismatch) {
							report("view %s failed its check", batch[j])
						}
					}
					v.Release()
				case 5:
					p.Remove(bg, batch[0], r.IntN(2) == 0)
				}
			}
		})
	}
	wg.Wait()
	for _, pr := range problems {
		t.Error(pr)
	}
	st, err := p.Stats(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.ChecksumErrors != 0 || hits == 0 || st.Detail[embedded.DetailEvictionRounds] == 0 {
		t.Fatalf("checksum errors %d, hits %d, eviction rounds %d: want 0 errors, some hits and rounds", st.ChecksumErrors, hits, st.Detail[embedded.DetailEvictionRounds])
	}
	for _, k := range names {
		p.Remove(bg, k, true)
	}
	if st, _ := p.Stats(bg); st.UsedBytes != 0 || st.Detail[embedded.DetailFreeExtents] != 2 {
		t.Fatalf("after removing all: used %d, %d free extents", st.UsedBytes, st.Detail[embedded.DetailFreeExtents])
	}
}
