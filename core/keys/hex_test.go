package keys

import (
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// TestHex: the hex every key ends with is encoding/hex's, for every byte value at every
// position of the hash, next to zeros and next to 0xff, and for random hashes; AppendHex
// appends it after what the slice holds, growing the slice or not.
func TestHex(t *testing.T) {
	check := func(h Hash) {
		t.Helper()
		want := hex.EncodeToString(h[:])
		if x := hexOf(h); string(x[:]) != want {
			t.Fatalf("hex of %x = %q", h[:], x[:])
		}
		if got := string(AppendHex([]byte("p/"), h)); got != "p/"+want {
			t.Fatalf("AppendHex = %q, want %q", got, "p/"+want)
		}
		if got := string(AppendHex(make([]byte, 1, 64), h)); got != "\x00"+want {
			t.Fatalf("AppendHex with room = %q, want %q", got, "\x00"+want)
		}
	}
	for i := range HashSize {
		for v := range 256 {
			var h Hash
			h[i] = byte(v)
			check(h)
			for j := range h {
				if j != i {
					h[j] = 0xff
				}
			}
			check(h)
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		var h Hash
		for i := range h {
			h[i] = byte(rng.Uint32())
		}
		check(h)
	}
}

// BenchmarkAppendHex appends the hex of 256 block hashes to one buffer, as a load builds its
// keys.
func BenchmarkAppendHex(b *testing.B) {
	hs := make([]Hash, 256)
	for i := range hs {
		for j := range hs[i] {
			hs[i][j] = byte(i*31 + j*7)
		}
	}
	buf := make([]byte, 0, len(hs)*2*HashSize)
	for b.Loop() {
		buf = buf[:0]
		for i := range hs {
			buf = AppendHex(buf, hs[i])
		}
	}
}
