package keys

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func randomBytes(r *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// TestCopyChecksumBlocksEveryLength checks the block-wise copy and hash against PageChecksum at
// every length from the long hash's shortest input to four blocks past a chunk, and at lengths
// one either side of each block boundary beyond: the number of scrambled blocks, the tail's
// stripes and the last stripe all move with the length.
func TestCopyChecksumBlocksEveryLength(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	src := randomBytes(r, 3*checksumChunk+5*xxh3Block)
	dst := make([]byte, len(src))
	check := func(n int) {
		t.Helper()
		got := copyChecksumBlocks(dst, src[:n])
		if want := PageChecksum(src[:n]); got != want {
			t.Fatalf("n=%d: copyChecksumBlocks = %#x, PageChecksum = %#x", n, uint64(got), uint64(want))
		}
		if !bytes.Equal(dst[:n], src[:n]) {
			t.Fatalf("n=%d: copied bytes differ", n)
		}
	}
	for n := xxh3LongMin; n <= 4*xxh3Block+xxh3Stripe; n++ {
		check(n)
	}
	for n := 4 * xxh3Block; n < len(src); n += xxh3Block {
		check(n - 1)
		check(n)
		check(n + 1)
	}
}

// TestAccumBlocksMatchesGeneric checks the lanes after the assembly (where the CPU runs it)
// against the Go version of the same steps, from one block to more than a chunk's worth.
func TestAccumBlocksMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	p := randomBytes(r, 70*xxh3Block)
	for _, blocks := range []int{0, 1, 2, 15, 16, 17, 64, 70} {
		want := newXXH3Acc()
		want.blocksGeneric(p[:blocks*xxh3Block])
		got := newXXH3Acc()
		accumBlocks(&got, p[:blocks*xxh3Block])
		if got != want {
			t.Fatalf("%d blocks: lanes %x, want %x", blocks, got, want)
		}
	}
}

// TestCopyChecksumBlocksCatchesChanges checks that one flipped bit in a block, in the tail or in
// the last stripe changes the digest of the block-wise path.
func TestCopyChecksumBlocksCatchesChanges(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	n := 2*checksumChunk + 700
	src := randomBytes(r, n)
	dst := make([]byte, n)
	want := copyChecksumBlocks(dst, src)
	for _, off := range []int{0, xxh3Block - 1, checksumChunk, 2*checksumChunk - 1, 2 * checksumChunk, n - 65, n - 1} {
		src[off] ^= 0x10
		if copyChecksumBlocks(dst, src) == want {
			t.Fatalf("flip at %d of %d not detected", off, n)
		}
		src[off] ^= 0x10
	}
}

// FuzzCopyChecksumBlocks checks the block-wise path against PageChecksum for any input the long
// hash takes, the input repeated reps times so that pages span several chunks too.
func FuzzCopyChecksumBlocks(f *testing.F) {
	f.Add(bytes.Repeat([]byte{1, 2, 3}, 100), uint8(1))
	f.Add(bytes.Repeat([]byte{9}, xxh3Block), uint8(70))
	f.Add(bytes.Repeat([]byte{4, 5}, 1000), uint8(255))
	f.Fuzz(func(t *testing.T, piece []byte, reps uint8) {
		src := bytes.Repeat(piece, max(1, int(reps)))
		if len(src) < xxh3LongMin {
			return
		}
		dst := make([]byte, len(src))
		if got, want := copyChecksumBlocks(dst, src), PageChecksum(src); got != want {
			t.Fatalf("%d bytes: copyChecksumBlocks %#x, PageChecksum %#x", len(src), uint64(got), uint64(want))
		}
		if !bytes.Equal(dst, src) {
			t.Fatal("copied bytes differ")
		}
	})
}
