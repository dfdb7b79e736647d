package mooncake_test

import (
	"fmt"
	"testing"

	"github.com/kvctl/kvctl/core/keys"
	"github.com/kvctl/kvctl/mooncake"
)

// benchBatchBytes is the payload of one batch in the put/get/copy benchmarks.
const benchBatchBytes = 32 << 20

var benchSizes = []struct {
	name string
	size int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

func benchPool(b *testing.B, capacity int64) *mooncake.Embedded {
	b.Helper()
	o := mooncake.DefaultOptions()
	o.Segments = []mooncake.SegmentSpec{{Name: "bench", Capacity: capacity}}
	o.EvictionPeriod = 0
	p, err := mooncake.NewEmbedded(o)
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
	p.BatchPut(bg, ks, bufs, mooncake.ReplicateConfig{})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := p.BatchIsExist(bg, ks)
		if res[1023] != 1 {
			b.Fatal("key missing")
		}
	}
}

func BenchmarkBatchPut(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			p := benchPool(b, benchBatchBytes)
			ks, bufs := benchPages(s.size)
			b.SetBytes(benchBatchBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j, c := range p.BatchPut(bg, ks, bufs, mooncake.ReplicateConfig{}) {
					if c != mooncake.OK {
						b.Fatalf("put %s = %v", ks[j], c)
					}
				}
				b.StopTimer()
				for _, k := range ks {
					p.Remove(bg, k, true)
				}
				b.StartTimer()
			}
		})
	}
}

func BenchmarkBatchGet(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			p := benchPool(b, benchBatchBytes)
			ks, bufs := benchPages(s.size)
			p.BatchPut(bg, ks, bufs, mooncake.ReplicateConfig{})
			dst := make([][]byte, len(ks))
			for i := range dst {
				dst[i] = make([]byte, s.size)
			}
			b.SetBytes(benchBatchBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j, n := range p.BatchGet(bg, ks, dst) {
					if n != int64(s.size) {
						b.Fatalf("get %s = %d", ks[j], n)
					}
				}
			}
		})
	}
}

// BenchmarkCopyBaseline copies the same pages between the same kind of buffers with copy: the
// bound a pool that copies each byte once could reach on this machine.
func BenchmarkCopyBaseline(b *testing.B) {
	for _, s := range benchSizes {
		b.Run(s.name, func(b *testing.B) {
			_, src := benchPages(s.size)
			dst := make([]byte, benchBatchBytes)
			b.SetBytes(benchBatchBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for j, page := range src {
					copy(dst[j*s.size:], page)
				}
			}
		})
	}
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
		p.BatchPut(bg, ks[i:i+batch], bufs[i:i+batch], mooncake.ReplicateConfig{})
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
		p.BatchPut(bg, again, againBufs, mooncake.ReplicateConfig{})
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
