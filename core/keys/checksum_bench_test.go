package keys

import (
	"hash/crc32"
	"testing"

	"github.com/zeebo/blake3"
)

// The candidates measured against XXH3 when the page checksum was chosen
// (docs/perf/checksum.md). They live here, in a test file, because only the benchmarks use them.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// mooncakeCRC64 is the object checksum of Mooncake's store client (MOONCAKE_STORE_CHECKSUM=1 in
// its newer releases): CRC-64 with the ECMA-182 polynomial, most significant bit first, initial
// value 0 and no final inversion, which catalogues call CRC-64/ECMA-182. Mooncake computes it a
// byte at a time; this one processes 8 bytes per step (slicing by 8), the faster of the two.
type crc64Tables [8][256]uint64

var mooncakeTables = func() *crc64Tables {
	const poly = 0x42F0E1EBA9EA3693
	var t crc64Tables
	for i := range 256 {
		c := uint64(i) << 56
		for range 8 {
			if c&(1<<63) != 0 {
				c = c<<1 ^ poly
			} else {
				c <<= 1
			}
		}
		t[0][i] = c
	}
	for i := range 256 {
		for k := 1; k < 8; k++ {
			t[k][i] = t[k-1][i]<<8 ^ t[0][t[k-1][i]>>56]
		}
	}
	return &t
}()

func mooncakeCRC64(crc uint64, p []byte) uint64 {
	t := mooncakeTables
	for len(p) >= 8 {
		c := crc ^ (uint64(p[0])<<56 | uint64(p[1])<<48 | uint64(p[2])<<40 | uint64(p[3])<<32 |
			uint64(p[4])<<24 | uint64(p[5])<<16 | uint64(p[6])<<8 | uint64(p[7]))
		crc = t[7][c>>56] ^ t[6][c>>48&0xff] ^ t[5][c>>40&0xff] ^ t[4][c>>32&0xff] ^
			t[3][c>>24&0xff] ^ t[2][c>>16&0xff] ^ t[1][c>>8&0xff] ^ t[0][c&0xff]
		p = p[8:]
	}
	for _, b := range p {
		crc = t[0][byte(crc>>56)^b] ^ crc<<8
	}
	return crc
}

// TestMooncakeCRC64CheckValue pins the CRC-64/ECMA-182 check value ("123456789") so the
// benchmarked function is the algorithm Mooncake uses.
func TestMooncakeCRC64CheckValue(t *testing.T) {
	if got := mooncakeCRC64(0, []byte("123456789")); got != 0x6C40DF5F0B497347 {
		t.Fatalf("CRC-64/ECMA-182 check = %#x, want 0x6c40df5f0b497347", got)
	}
	// Split input gives the same value as whole input.
	if mooncakeCRC64(mooncakeCRC64(0, []byte("1234")), []byte("56789")) != 0x6C40DF5F0B497347 {
		t.Fatal("CRC-64/ECMA-182 is not incremental")
	}
}

// checksumBenchArena is larger than any last-level cache, so each page is read from memory as a
// pool page is, not from cache.
const checksumBenchArena = 256 << 20

var checksumSink uint64

func benchChecksumPages(b *testing.B, page int, fn func(dst, src []byte)) {
	src := make([]byte, checksumBenchArena)
	for i := range src {
		src[i] = byte(i*7 + i>>12)
	}
	dst := make([]byte, checksumBenchArena)
	copy(dst, src)
	b.SetBytes(int64(page))
	b.ResetTimer()
	off := 0
	for range b.N {
		fn(dst[off:off+page], src[off:off+page])
		off += page
		if off+page > checksumBenchArena {
			off = 0
		}
	}
}

// BenchmarkChecksum compares, on one goroutine, a plain copy of a page with each candidate
// checksum alone and with the copy-then-check a pool get does (copy the page, hash the copy).
// "fused" is CopyChecksum, the pool's path.
func BenchmarkChecksum(b *testing.B) {
	for _, s := range []struct {
		name string
		size int
	}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}} {
		b.Run(s.name+"/copy", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(d, src []byte) { copy(d, src) })
		})
		b.Run(s.name+"/xxh3", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(_, src []byte) { checksumSink += uint64(PageChecksum(src)) })
		})
		b.Run(s.name+"/blake3", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(_, src []byte) { x := blake3.Sum256(src); checksumSink += uint64(x[0]) })
		})
		b.Run(s.name+"/crc32c", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(_, src []byte) { checksumSink += uint64(crc32.Checksum(src, castagnoli)) })
		})
		b.Run(s.name+"/mooncake-crc64", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(_, src []byte) { checksumSink += mooncakeCRC64(0, src) })
		})
		b.Run(s.name+"/copy+blake3", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(d, src []byte) { copy(d, src); x := blake3.Sum256(d); checksumSink += uint64(x[0]) })
		})
		b.Run(s.name+"/copy+crc32c", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(d, src []byte) { copy(d, src); checksumSink += uint64(crc32.Checksum(d, castagnoli)) })
		})
		b.Run(s.name+"/copy+xxh3", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(d, src []byte) { copy(d, src); checksumSink += uint64(PageChecksum(d)) })
		})
		b.Run(s.name+"/fused-xxh3", func(b *testing.B) {
			benchChecksumPages(b, s.size, func(d, src []byte) { checksumSink += uint64(CopyChecksum(d, src)) })
		})
	}
}
