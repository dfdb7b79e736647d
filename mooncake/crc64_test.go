package mooncake

import (
	"math/rand/v2"
	"testing"
)

// crc64Bitwise is the definition, one bit at a time: the reference the table version must match.
func crc64Bitwise(p []byte) uint64 {
	var crc uint64
	for _, b := range p {
		crc ^= uint64(b) << 56
		for range 8 {
			if crc&(1<<63) != 0 {
				crc = crc<<1 ^ crc64Poly
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// TestObjectChecksum pins Mooncake's check value and the empty object, and matches the
// bit-at-a-time definition for every length up to 300 and for split updates.
func TestObjectChecksum(t *testing.T) {
	if got := ObjectChecksum([]byte("123456789")); got != 0x6C40DF5F0B497347 {
		t.Fatalf("check value %#x, want 0x6C40DF5F0B497347", got)
	}
	if got := ObjectChecksum(nil); got != 0 {
		t.Fatalf("empty object %#x, want 0", got)
	}
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 300)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= len(buf); n++ {
		want := crc64Bitwise(buf[:n])
		if got := ObjectChecksum(buf[:n]); got != want {
			t.Fatalf("length %d: %#x, want %#x", n, got, want)
		}
		cut := n / 3
		if got := crc64Update(crc64Update(0, buf[:cut]), buf[cut:n]); got != want {
			t.Fatalf("length %d split at %d: %#x, want %#x", n, cut, got, want)
		}
	}
}

func BenchmarkObjectChecksum(b *testing.B) {
	page := make([]byte, 64<<10)
	for i := range page {
		page[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(page)))
	for b.Loop() {
		ObjectChecksum(page)
	}
}
