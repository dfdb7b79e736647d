package embedded_test

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/pool"
	"github.com/kvctl/kvctl/pool/embedded"
)

// benchBatchBytes is the payload of one batch in the put/get/copy benchmarks.
const benchBatchBytes = 32 << 20

var benchSizes = []struct {
	name string
	size int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

func benchPool(b *testing.B, capacity int64) *embedded.Embedded {
	b.Helper()
	o := embedded.DefaultOptions()
	o.Segments = []embedded.SegmentSpec{{Name: "bench", Capacity: capacity}}
	o.EvictionPeriod = 0
	p, err := embedded.NewEmbedded(o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	return p
}

func benchPages(size int) ([]string, [][]byte) {
	n := benchBatchBytes / size
	ks := make([]string, n)
	bufs := make([][]byte, n)
	for i := range ks {
		ks[i] = fmt.Sprintf("bench/%d/%d", size, i)
		bufs[i] = make([]byte, size)
		for j := range bufs[i] {
			bufs[i][j] = byte(i + j*7)
		}
	}
	return ks, bufs
}

func BenchmarkBatchIsExist1024(b *testing.B) {
	p := benchPool(b, 64<<20)
	ks := make([]string, 1024)
	bufs := make([][]byte, 1024)
	for i := range ks {
		ks[i] = fmt.Sprintf("ns/model/w1r0/%016x", i*7919)
		bufs[i] = make([]byte, 4096)
	}
	p.BatchPut(bg, ks, bufs, pool.ReplicateConfig{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := p.BatchIsExist(bg, ks)
		if res[1023] != 1 {
			b.Fatal("key missing")
		}
	}
}

// benchCallers are the caller counts the put, get and copy benchmarks run at: one goroutine and
// one per CPU. Each caller moves its own 32 MiB batch per operation, so an operation moves
// callers × 32 MiB.
func benchCallers() []int {
	if n := runtime.GOMAXPROCS(0); n > 1 {
		return []int{1, n}
	}
	return []int{1}
}

// runCallers runs one operation: fn(c) on each of callers goroutines, and waits for all.
func runCallers(callers int, fn func(c int)) {
	if callers == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() { fn(c) })
	}
	wg.Wait()
}

// callerPages gives every caller its own keys (same contents).
func callerPages(callers, size int) ([][]string, [][]byte) {
	ks, bufs := benchPages(size)
	out := make([][]string, callers)
	for c := range out {
		out[c] = make([]string, len(ks))
		for i, k := range ks {
			out[c][i] = fmt.Sprintf("c%d/%s", c, k)
		}
	}
	return out, bufs
}

// ownPages gives every caller its own 32 MiB of pages (contents differ per caller).
func ownPages(callers, size int) [][][]byte {
	out := make([][][]byte, callers)
	for c := range out {
		_, out[c] = benchPages(size)
		for _, page := range out[c] {
			page[0] = byte(c)
		}
	}
	return out
}

// BenchmarkCopyBaselineOwnSource is BenchmarkCopyBaseline with every caller copying from its own
// 32 MiB of pages, as every caller of BenchmarkBatchGet reads its own stored batch; in
// BenchmarkCopyBaseline all callers read the same 32 MiB, which at more than one caller can
// stay in the last-level cache while the gets' sources cannot.
func BenchmarkCopyBaselineOwnSource(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				src := ownPages(callers, s.size)
				dst := make([][]byte, callers)
				for c := range dst {
					dst[c] = bytes.Repeat([]byte{1}, benchBatchBytes) // resident before timing
				}
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					runCallers(callers, func(c int) {
						spread(len(src[c]), func(j int) { copy(dst[c][j*s.size:], src[c][j]) })
					})
				}
			})
		}
	}
}

// BenchmarkBatchPut puts a 32 MiB batch per caller into an empty pool (the removal between
// operations is not timed).
func BenchmarkBatchPut(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				p := benchPool(b, int64(callers)*benchBatchBytes)
				ks, bufs := callerPages(callers, s.size)
				put := func(c int) {
					for j, code := range p.BatchPut(bg, ks[c], bufs, pool.ReplicateConfig{}) {
						if code != pool.OK {
							b.Errorf("put %s = %v", ks[c][j], code)
							return
						}
					}
				}
				removeAll := func() {
					for c := range ks {
						for _, k := range ks[c] {
							p.Remove(bg, k, true)
						}
					}
				}
				// One untimed round first: the pool's memory is then resident, as the copy
				// baseline's destination is (first touch is BenchmarkBatchPutFirstTouch's).
				runCallers(callers, put)
				removeAll()
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					runCallers(callers, put)
					b.StopTimer()
					removeAll()
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkBatchGet gets a stored 32 MiB batch per caller into caller buffers.
func BenchmarkBatchGet(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				p := benchPool(b, int64(callers)*benchBatchBytes)
				ks, bufs := callerPages(callers, s.size)
				dst := make([][][]byte, callers)
				for c := range dst {
					p.BatchPut(bg, ks[c], bufs, pool.ReplicateConfig{})
					dst[c] = make([][]byte, len(bufs))
					for i := range dst[c] {
						dst[c][i] = bytes.Repeat([]byte{1}, s.size) // resident before timing
					}
				}
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					runCallers(callers, func(c int) {
						for j, n := range p.BatchGet(bg, ks[c], dst[c]) {
							if n != int64(s.size) {
								b.Errorf("get %s = %d", ks[c][j], n)
								return
							}
						}
					})
				}
			})
		}
	}
}

// BenchmarkBatchView leases and verifies a stored 32 MiB batch per caller in place (what a load
// does when the pool's memory is registered with the GPU): a read of every byte, no copy.
func BenchmarkBatchView(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				p := benchPool(b, int64(callers)*benchBatchBytes)
				ks, bufs := callerPages(callers, s.size)
				for c := range ks {
					p.BatchPut(bg, ks[c], bufs, pool.ReplicateConfig{})
				}
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					runCallers(callers, func(c int) {
						v := p.BatchView(bg, ks[c])
						for j, n := range v.Codes {
							if n != int64(s.size) {
								b.Errorf("view %s = %d", ks[c][j], n)
							}
						}
						v.Release()
					})
				}
			})
		}
	}
}

// BenchmarkCopyBaseline copies the same pages between the same kind of buffers with copy, per
// caller, spreading each 32 MiB batch over the CPUs exactly as the pool spreads a batch's copies
// (one goroutine per CPU, pages handed out in order): the bound a pool that copies each byte once
// could reach on this machine with the same goroutines. Compare BatchPut and BatchGet with the
// row of the same size and caller count.
func BenchmarkCopyBaseline(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				_, src := benchPages(s.size)
				dst := make([][]byte, callers)
				for c := range dst {
					dst[c] = bytes.Repeat([]byte{1}, benchBatchBytes) // resident before timing
				}
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					runCallers(callers, func(c int) {
						spread(len(src), func(j int) { copy(dst[c][j*s.size:], src[j]) })
					})
				}
			})
		}
	}
}

// spread calls fn(0..n-1) on GOMAXPROCS goroutines taking indices in order, as the pool's batch
// calls do for batches of 512 KiB and more (all the batches here).
func spread(n int, fn func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// BenchmarkEvictionRound1M times one eviction round over 1M stored objects (64-byte values),
// the census, the selection of the oldest 5 % and their removal. Refilling the pool between
// rounds is not timed.
func BenchmarkEvictionRound1M(b *testing.B) {
	const n, size = 1 << 20, 64
	p := benchPool(b, int64(n*size)*100/95) // 95 % full: above the 90 % watermark
	ks := make([]string, n)
	bufs := make([][]byte, n)
	page := make([]byte, size)
	for i := range ks {
		ks[i] = fmt.Sprintf("evict/%08d", i)
		bufs[i] = page
	}
	const batch = 4096
	for i := 0; i < n; i += batch {
		p.BatchPut(bg, ks[i:i+batch], bufs[i:i+batch], pool.ReplicateConfig{})
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, ran := p.EvictNow()
		if !ran || len(r.Evicted) == 0 {
			b.Fatal("no eviction")
		}
		b.StopTimer()
		var again []string
		var againBufs [][]byte
		for _, e := range r.Evicted {
			again = append(again, e.Key)
			againBufs = append(againBufs, page)
		}
		p.BatchPut(bg, again, againBufs, pool.ReplicateConfig{})
		b.StartTimer()
	}
	b.ReportMetric(float64(n), "objects")
}

// BenchmarkChecksumBaseline hashes the same pages with keys.PageChecksum on one goroutine: the other cost
// every put and every get pays.
func BenchmarkChecksumBaseline(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			_, src := benchPages(s.size)
			b.SetBytes(benchBatchBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for _, page := range src {
					keys.PageChecksum(page)
				}
			}
		})
	}
}

// BenchmarkBatchPutFirstTouch puts a 32 MiB batch per caller into a pool made for that operation
// (not timed), so every put writes memory no put wrote before: without Options.Prefault each
// page costs a page fault and the kernel's zeroing on first touch; with it the pool was made
// resident when it was made. Compare with BatchPut, whose pool memory was written before.
func BenchmarkBatchPutFirstTouch(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, pre := range []bool{false, true} {
			b.Run(fmt.Sprintf("1MiB/callers=%d/prefault=%v", callers, pre), func(b *testing.B) {
				ks, bufs := callerPages(callers, 1<<20)
				b.SetBytes(int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					o := embedded.DefaultOptions()
					o.Segments = []embedded.SegmentSpec{{Name: "bench", Capacity: int64(callers) * benchBatchBytes}}
					o.EvictionPeriod = 0
					o.Prefault = pre
					p, err := embedded.NewEmbedded(o)
					if err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					runCallers(callers, func(c int) {
						for j, code := range p.BatchPut(bg, ks[c], bufs, pool.ReplicateConfig{}) {
							if code != pool.OK {
								b.Errorf("put %s = %v", ks[c][j], code)
								return
							}
						}
					})
					b.StopTimer()
					p.Close()
					b.StartTimer()
				}
			})
		}
	}
}

// BenchmarkPrefault makes a pool of one 256 MiB segment with Options.Prefault: what making the
// memory resident costs at start, in bytes per second.
func BenchmarkPrefault(b *testing.B) {
	const size = 256 << 20
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		o := embedded.DefaultOptions()
		o.Segments = []embedded.SegmentSpec{{Name: "bench", Capacity: size}}
		o.EvictionPeriod = 0
		o.Prefault = true
		p, err := embedded.NewEmbedded(o)
		if err != nil {
			b.Fatal(err)
		}
		p.Close()
	}
}

// BenchmarkBatchPutGetVsCopy runs, in every operation and with the same callers, the copy
// baseline's copy, a put into memory written before and a get of what was put, and reports each
// one's rate and the put/copy and get/copy ratios from the sums of their own times: on a shared
// machine, whose load changes between the separate put, get and copy benchmarks, the three are
// then measured under the same load. Every caller has its own source pages (ownPages), so each
// of the three reads 32 MiB per caller that no other caller reads and writes 32 MiB of its own.
// The removal after each operation is in ns/op and MB/s but not in the reported rates and ratios.
func BenchmarkBatchPutGetVsCopy(b *testing.B) {
	for _, callers := range benchCallers() {
		for _, s := range benchSizes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				p := benchPool(b, int64(callers)*benchBatchBytes)
				ks, _ := callerPages(callers, s.size)
				src := ownPages(callers, s.size)
				dst := make([][][]byte, callers)
				flat := make([][]byte, callers)
				for c := range dst {
					dst[c] = make([][]byte, len(src[c]))
					for i := range dst[c] {
						dst[c][i] = bytes.Repeat([]byte{1}, s.size)
					}
					flat[c] = bytes.Repeat([]byte{1}, benchBatchBytes)
				}
				put := func(c int) {
					for j, code := range p.BatchPut(bg, ks[c], src[c], pool.ReplicateConfig{}) {
						if code != pool.OK {
							b.Errorf("put %s = %v", ks[c][j], code)
							return
						}
					}
				}
				get := func(c int) {
					for j, n := range p.BatchGet(bg, ks[c], dst[c]) {
						if n != int64(s.size) {
							b.Errorf("get %s = %d", ks[c][j], n)
							return
						}
					}
				}
				cp := func(c int) {
					spread(len(src[c]), func(j int) { copy(flat[c][j*s.size:], src[c][j]) })
				}
				removeAll := func() {
					for c := range ks {
						for _, k := range ks[c] {
							p.Remove(bg, k, true)
						}
					}
				}
				runCallers(callers, put)
				removeAll()
				var tCopy, tPut, tGet time.Duration
				b.SetBytes(3 * int64(callers) * benchBatchBytes)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					t0 := time.Now()
					runCallers(callers, cp)
					t1 := time.Now()
					runCallers(callers, put)
					t2 := time.Now()
					runCallers(callers, get)
					t3 := time.Now()
					removeAll()
					tCopy, tPut, tGet = tCopy+t1.Sub(t0), tPut+t2.Sub(t1), tGet+t3.Sub(t2)
				}
				moved := float64(b.N) * float64(callers) * benchBatchBytes
				b.ReportMetric(moved/tCopy.Seconds()/1e9, "copy-GB/s")
				b.ReportMetric(moved/tPut.Seconds()/1e9, "put-GB/s")
				b.ReportMetric(moved/tGet.Seconds()/1e9, "get-GB/s")
				b.ReportMetric(100*tCopy.Seconds()/tPut.Seconds(), "put/copy-%")
				b.ReportMetric(100*tCopy.Seconds()/tGet.Seconds(), "get/copy-%")
			})
		}
	}
}
